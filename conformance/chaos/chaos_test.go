package chaos

import (
	"reflect"
	"testing"
	"time"
)

// TestDrawReplays: a seed draws the same schedule every time; another seed
// another one; every kind comes once before any comes again; the waits fit
// the run and the pauses their bounds.
func TestDrawReplays(t *testing.T) {
	cfg := Config{Seed: 42, Duration: 10 * time.Minute, Members: 3, WriteLease: 1500 * time.Millisecond, MinGap: 3 * time.Second, MaxGap: 8 * time.Second}
	a, b := Draw(cfg), Draw(cfg)
	if !reflect.DeepEqual(a, b) {
		t.Fatal("one seed drew two schedules")
	}
	cfg.Seed = 43
	if reflect.DeepEqual(a, Draw(cfg)) {
		t.Fatal("seeds 42 and 43 drew the same schedule")
	}
	if len(a) < 2*len(Kinds) {
		t.Fatalf("%d faults in 10 minutes at 3-8 s apart", len(a))
	}
	seen := map[Kind]bool{}
	var total time.Duration
	for i, f := range a {
		if i < len(Kinds)-1 { // every kind but ForcedSwitch
			if f.Kind == ForcedSwitch {
				t.Errorf("fault %d: a forced switch drawn without Forced", i)
			}
			if seen[f.Kind] {
				t.Errorf("fault %d, %s, drawn again before every kind was", i, f.Kind)
			}
			seen[f.Kind] = true
		}
		total += f.After
		if f.After < cfg.MinGap || f.After >= cfg.MaxGap {
			t.Errorf("fault %d waits %v, outside [%v, %v)", i, f.After, cfg.MinGap, cfg.MaxGap)
		}
		if f.Member == f.Other || f.Member < 0 || f.Member >= cfg.Members || f.Other < 0 || f.Other >= cfg.Members {
			t.Errorf("fault %d: members %d and %d of %d", i, f.Member, f.Other, cfg.Members)
		}
		if f.Kind == PauseMember && f.Pause > 2*cfg.WriteLease {
			t.Errorf("fault %d pauses a member %v, past twice the lease", i, f.Pause)
		}
	}
	for _, f := range a {
		if f.Kind == ForcedSwitch {
			t.Fatal("a forced switch drawn without Forced")
		}
	}
	cfg.Seed, cfg.Forced = 42, true
	forced := 0
	for _, f := range Draw(cfg) {
		if f.Kind == ForcedSwitch {
			forced++
		}
	}
	if forced == 0 {
		t.Error("no forced switch drawn with Forced")
	}
	if total > cfg.Duration {
		t.Errorf("the waits add up to %v, past the run's %v", total, cfg.Duration)
	}
}

// TestDrawSkewReplays: a seed skews one member's clock by the same amount
// every time, within its bounds; the faults it draws do not depend on it.
func TestDrawSkewReplays(t *testing.T) {
	m, d := DrawSkew(42, 3)
	if m2, d2 := DrawSkew(42, 3); m2 != m || d2 != d {
		t.Fatalf("seed 42 skewed member %d by %v, then member %d by %v", m, d, m2, d2)
	}
	signs := map[bool]bool{}
	for seed := uint64(0); seed < 64; seed++ {
		m, d := DrawSkew(seed, 3)
		if m < 0 || m >= 3 || d.Abs() < time.Minute || d.Abs() > 3*time.Hour {
			t.Fatalf("seed %d: member %d skewed by %v", seed, m, d)
		}
		signs[d > 0] = true
	}
	if len(signs) != 2 {
		t.Fatal("64 seeds skewed every clock the same way")
	}
}
