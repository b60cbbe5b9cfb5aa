package routing

import "testing"

func TestEpochRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name string
		gen  uint32
		phys int32
		want int32
	}{
		{"generation 0 is identity", 0, 7, 7},
		{"unknown epoch passes", 3, -1, -1},
		{"generation 1 shifts", 1, 5, 1<<EpochBits + 5},
		{"high generation", 2000, 123, 2000<<EpochBits + 123},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := VirtualEpoch(tc.gen, tc.phys)
			if v != tc.want {
				t.Fatalf("VirtualEpoch(%d, %d) = %d, want %d", tc.gen, tc.phys, v, tc.want)
			}
			p, ok := PhysicalEpoch(tc.gen, v)
			if !ok || p != tc.phys {
				t.Fatalf("PhysicalEpoch = %d, %v; want %d, true", p, ok, tc.phys)
			}
		})
	}
}

func TestEpochsNeverGoBackwardsAcrossGenerations(t *testing.T) {
	// The largest epoch of generation 0 is below the smallest of generation 1.
	if VirtualEpoch(0, epochMask) >= VirtualEpoch(1, 0) {
		t.Fatal("generation 1 epochs must exceed every generation 0 epoch")
	}
	if _, ok := PhysicalEpoch(1, VirtualEpoch(0, 9)); ok {
		t.Fatal("an epoch of generation 0 must be refused under generation 1")
	}
}

func TestPIDRoundTrip(t *testing.T) {
	if VirtualPID(0, 4242) != 4242 {
		t.Fatal("generation 0 PIDs are identity")
	}
	v := VirtualPID(2, 4242)
	if v == 4242 || v < 0 {
		t.Fatalf("generation 2 PID %d must differ and stay positive", v)
	}
	if p, ok := PhysicalPID(2, v); !ok || p != 4242 {
		t.Fatalf("PhysicalPID = %d, %v", p, ok)
	}
	if _, ok := PhysicalPID(3, v); ok {
		t.Fatal("a PID of generation 2 must be refused under generation 3")
	}
}

func TestVirtualTopicIDStableAndDistinct(t *testing.T) {
	a := VirtualTopicID("ferry", "orders")
	if a != VirtualTopicID("ferry", "orders") {
		t.Fatal("not stable")
	}
	if a == VirtualTopicID("ferry", "orders2") || a == VirtualTopicID("other", "orders") {
		t.Fatal("collides")
	}
	if a == ([16]byte{}) {
		t.Fatal("zero UUID")
	}
}

func TestTableAdvanceOnlyForward(t *testing.T) {
	tb := NewTable(State{Generation: 1, Active: "a"})
	if tb.Advance(State{Generation: 1, Active: "b"}) {
		t.Fatal("equal generation replaced the state")
	}
	if !tb.Advance(State{Generation: 2, Active: "b"}) || tb.Current().Active != "b" {
		t.Fatal("newer generation not installed")
	}
	if tb.Advance(State{Generation: 1, Active: "a"}) || tb.Current().Generation != 2 {
		t.Fatal("older generation replaced the state")
	}
}

// TestEpochLimits: the last generation and the largest physical epoch that
// fit map to positive epochs that round-trip; past either, clients see an
// unknown epoch (-1), never a negative or truncated one naming another
// leader or generation.
func TestEpochLimits(t *testing.T) {
	v := VirtualEpoch(MaxGeneration, MaxPhysicalEpoch)
	if v <= 0 {
		t.Fatalf("VirtualEpoch(MaxGeneration, MaxPhysicalEpoch) = %d, want positive", v)
	}
	if p, ok := PhysicalEpoch(MaxGeneration, v); !ok || p != MaxPhysicalEpoch {
		t.Fatalf("PhysicalEpoch(%d) = %d, %v; want %d, true", v, p, ok, MaxPhysicalEpoch)
	}
	if MaxGeneration != 2047 || MaxPhysicalEpoch != 1<<20-1 {
		t.Fatalf("limits %d and %d differ from those documented (2047, 2^20-1)", MaxGeneration, MaxPhysicalEpoch)
	}
	for _, tc := range []struct {
		gen  uint32
		phys int32
	}{
		{1, MaxPhysicalEpoch + 1},  // truncated to epoch 0 before
		{3, MaxPhysicalEpoch + 5},  // truncated to 4 before: another leader's
		{MaxGeneration + 1, 0},     // negative before
		{MaxGeneration + 1, 7},     // negative before
		{4095, MaxPhysicalEpoch},   // -1 before by accident; still -1
		{0, MaxPhysicalEpoch + 1},  // generation 0 too: clients must not see it as epoch 0
		{MaxGeneration, 1<<31 - 1}, // the largest int32
	} {
		if got := VirtualEpoch(tc.gen, tc.phys); got != -1 {
			t.Errorf("VirtualEpoch(%d, %d) = %d, want -1 (unknown)", tc.gen, tc.phys, got)
		}
	}
}
