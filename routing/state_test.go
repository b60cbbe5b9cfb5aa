package routing

import "testing"

// TestLostStart: the start of a partition's lost range is given for a
// leader epoch of a generation before a forced switch's, and for nothing
// else: a planned switch, an epoch of the current generation, an unknown
// epoch, a partition that lost nothing.
func TestLostStart(t *testing.T) {
	from := uint32(2)
	forced := State{Generation: 3, Active: "b", Last: &Switch{Mode: Forced, From: "a", To: "b", FromGeneration: &from,
		Outcome: OutcomeSwitched, Lost: []LostRange{{Topic: "t", Partition: 1, From: 40, To: UnknownEnd}}}}
	planned := forced
	pl := *forced.Last
	pl.Mode = Planned
	planned.Last = &pl
	back := forced
	back.Active = "a" // rolled back: Last did not make the state
	for _, c := range []struct {
		name      string
		s         State
		partition int32
		epoch     int32
		want      int64
		ok        bool
	}{
		{"read before the forced switch", forced, 1, VirtualEpoch(2, 7), 40, true},
		{"read two generations before", forced, 1, VirtualEpoch(1, 7), 40, true},
		{"read after it", forced, 1, VirtualEpoch(3, 0), 0, false},
		{"no epoch", forced, 1, -1, 0, false},
		{"a partition that lost nothing", forced, 0, VirtualEpoch(2, 7), 0, false},
		{"a planned switch", planned, 1, VirtualEpoch(2, 7), 0, false},
		{"a state the switch did not make", back, 1, VirtualEpoch(2, 7), 0, false},
	} {
		got, ok := c.s.LostStart("t", c.partition, c.epoch)
		if got != c.want || ok != c.ok {
			t.Errorf("%s: LostStart = %d, %v; want %d, %v", c.name, got, ok, c.want, c.ok)
		}
	}
}
