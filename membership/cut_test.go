package membership

import (
	"testing"
)

// A member whose gossip is cut off is dead to the others and sees itself
// alone, and is one of them again when joined up: the chaos run's
// network-partition fault rests on this.
func TestCutTransportPartitionsAndHeals(t *testing.T) {
	a := start(t, testConfig(), testMeta(1))
	b := start(t, testConfig(a.selfAddr), testMeta(2))
	cfg := testConfig(a.selfAddr)
	cut, err := NewCutTransport(cfg.Bind)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Transport = cut
	c := start(t, cfg, testMeta(3))
	for _, m := range []*member{a, b, c} {
		m.sees(1, 2, 3)
	}

	cut.Cut(true)
	a.sees(1, 2)
	b.sees(1, 2)
	c.sees(3)

	cut.Cut(false)
	for _, m := range []*member{a, b, c} {
		m.sees(1, 2, 3)
	}
}
