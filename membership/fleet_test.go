package membership

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/ferry-gw/ferry/internal/testwait"
)

// patience bounds every wait: generous, for a busy 2-core machine under
// -race. Waits poll; none sleeps a fixed time to let something happen.
const patience = 45 * time.Second

// testConfig is a fleet on 127.0.0.1 with fast timings.
func testConfig(seeds ...string) Config {
	return Config{
		Bind:             "127.0.0.1:0",
		Seeds:            seeds,
		Profile:          "local",
		ProbeInterval:    200 * time.Millisecond,
		ProbeTimeout:     100 * time.Millisecond,
		SuspicionMult:    3,
		GossipInterval:   30 * time.Millisecond,
		PushPullInterval: 2 * time.Second,
		TCPTimeout:       2 * time.Second,
		JoinBackoff:      50 * time.Millisecond,
		JoinBackoffMax:   300 * time.Millisecond,
		RejoinInterval:   300 * time.Millisecond,
	}
}

func testMeta(id int32) Meta {
	return Meta{NodeID: id, Host: "127.0.0.1", Ports: []int32{19000 + id, 19100 + id},
		Admin: "127.0.0.1:" + strconv.Itoa(int(18000+id)), Version: "test"}
}

type member struct {
	*Fleet
	t    *testing.T
	logs *observer.ObservedLogs
	reg  *prometheus.Registry
	ran  chan error
}

// start creates a member and runs it until the test ends.
func start(t *testing.T, cfg Config, meta Meta) *member {
	t.Helper()
	m := newMember(t, cfg, meta)
	m.run()
	return m
}

func newMember(t *testing.T, cfg Config, meta Meta) *member {
	t.Helper()
	core, logs := observer.New(zapcore.DebugLevel)
	reg := prometheus.NewRegistry()
	f, err := New(cfg, meta, zap.New(core).With(zap.Int32("member", meta.NodeID)), reg)
	if err != nil {
		t.Fatalf("New(%d): %v", meta.NodeID, err)
	}
	m := &member{Fleet: f, t: t, logs: logs, reg: reg}
	t.Cleanup(func() {
		if err := f.Close(); err != nil {
			t.Errorf("Close(%d): %v", meta.NodeID, err)
		}
		if m.ran != nil {
			select {
			case err := <-m.ran:
				if err != nil {
					t.Errorf("Run(%d): %v", meta.NodeID, err)
				}
			case <-time.After(patience):
				t.Errorf("Run(%d) did not return after Close", meta.NodeID)
			}
		}
		if t.Failed() {
			for _, e := range logs.All() {
				if e.Level >= zapcore.InfoLevel {
					t.Logf("member %d log: %s %s %v", meta.NodeID, e.Level, e.Message, e.ContextMap())
				}
			}
		}
	})
	return m
}

func (m *member) run() {
	m.ran = make(chan error, 1)
	go func() { m.ran <- m.Run(context.Background()) }()
}

// kill stops a member's gossip without leaving, as a crash would.
func (m *member) kill() {
	if err := m.stop(false); err != nil {
		m.t.Fatal(err)
	}
}

// view renders members as "1@127.0.0.1:port/alive ...".
func view(ms []Member) string {
	var parts []string
	for _, m := range ms {
		parts = append(parts, fmt.Sprintf("%d@%s/%s", m.NodeID, m.Addr, m.State))
	}
	return strings.Join(parts, " ")
}

func ids(ms []Member) []int32 {
	var out []int32
	for _, m := range ms {
		out = append(out, m.NodeID)
	}
	return out
}

// sees waits until m's Alive members are exactly want.
func (m *member) sees(want ...int32) {
	m.t.Helper()
	testwait.Eventually(m.t, patience, fmt.Sprintf("member %d sees alive %v", m.id, want), func() error {
		if got := m.Alive(); !slices.Equal(ids(got), want) {
			return fmt.Errorf("alive: %s", view(got))
		}
		return nil
	})
}

func (m *member) stateOf(id int32) (Member, bool) {
	for _, x := range m.Members() {
		if x.NodeID == id {
			return x, true
		}
	}
	return Member{}, false
}

func (m *member) logged(level zapcore.Level, substr string) bool {
	for _, e := range m.logs.All() {
		if e.Level >= level && strings.Contains(e.Message+" "+fmt.Sprint(e.ContextMap()), substr) {
			return true
		}
	}
	return false
}

// threeMembers starts members 1, 2 and 3, 2 and 3 joining 1.
func threeMembers(t *testing.T) (a, b, c *member) {
	a = start(t, testConfig(), testMeta(1))
	b = start(t, testConfig(a.selfAddr), testMeta(2))
	c = start(t, testConfig(a.selfAddr), testMeta(3))
	for _, m := range []*member{a, b, c} {
		m.sees(1, 2, 3)
	}
	return a, b, c
}

func TestThreeMembersJoinAndSeeMetadata(t *testing.T) {
	a, b, c := threeMembers(t)
	for _, m := range []*member{a, b, c} {
		// Seen by every member is not yet ready: a member is marked
		// ready when its Join returns (joinLoop), which can come after
		// gossip has spread it (seen on a loaded machine).
		testwait.Eventually(t, patience, fmt.Sprintf("member %d ready", m.id), func() error {
			if ok, reason := m.Ready(); !ok {
				return errors.New(reason)
			}
			return nil
		})
		ms := m.Alive()
		for i, x := range ms {
			want := testMeta(int32(i + 1))
			if x.Host != want.Host || !slices.Equal(x.Ports, want.Ports) || x.Admin != want.Admin || x.Version != want.Version {
				t.Errorf("member %d sees %d with meta %+v, want %+v", m.id, x.NodeID, x.Meta, want)
			}
			if x.Self != (x.NodeID == m.id) {
				t.Errorf("member %d sees %d with Self=%v", m.id, x.NodeID, x.Self)
			}
		}
		if got, want := ms[m.id-1].Addr, m.Local().Addr; got != want {
			t.Errorf("member %d: own address %s in Members, %s in Local", m.id, got, want)
		}
		testwait.Eventually(t, patience, "alive gauge", func() error {
			if g := testutil.ToFloat64(m.metrics.members.WithLabelValues("alive")); g != 3 {
				return fmt.Errorf("ferry_fleet_members{state=alive} = %v", g)
			}
			return nil
		})
	}
	if l := a.Local(); l.NodeID != 1 || !l.Self || l.State != Alive || l.Addr != a.selfAddr {
		t.Errorf("Local() = %+v", l)
	}
}

func TestFirstMemberReadyAtOnceAndNotBeforeRun(t *testing.T) {
	a := newMember(t, testConfig(), testMeta(1))
	if ok, reason := a.Ready(); ok || reason == "" {
		t.Errorf("before Run: Ready() = %v, %q; want false with a reason", ok, reason)
	}
	a.run()
	testwait.Eventually(t, patience, "ready", func() error {
		if ok, reason := a.Ready(); !ok {
			return errors.New(reason)
		}
		return nil
	})
	if err := a.Run(context.Background()); err == nil {
		t.Error("second Run did not fail")
	}
}

func TestDNSSeed(t *testing.T) {
	a := start(t, testConfig(), testMeta(1))
	_, port, _ := net.SplitHostPort(a.selfAddr)
	b := start(t, testConfig("localhost:"+port), testMeta(2))
	a.sees(1, 2)
	b.sees(1, 2)
}

func TestSeedsNamingOnlySelf(t *testing.T) {
	port := freePort(t)
	cfg := testConfig("localhost:"+port, "127.0.0.1:"+port)
	cfg.Bind = "127.0.0.1:" + port
	a := start(t, cfg, testMeta(1))
	testwait.Eventually(t, patience, "ready as the first member", func() error {
		if ok, reason := a.Ready(); !ok {
			return errors.New(reason)
		}
		return nil
	})
	if !a.logged(zapcore.InfoLevel, "first member") {
		t.Error("no log of being the first member")
	}
}

func freePort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, port, _ := net.SplitHostPort(l.Addr().String())
	return port
}

func TestUnreachableSeedsNotReady(t *testing.T) {
	seed := "127.0.0.1:" + freePort(t) // nobody there
	a := start(t, testConfig(seed), testMeta(1))
	testwait.Eventually(t, patience, "not ready naming the seed", func() error {
		ok, reason := a.Ready()
		if ok || !strings.Contains(reason, seed) {
			return fmt.Errorf("Ready() = %v, %q", ok, reason)
		}
		if !a.logged(zapcore.WarnLevel, "cannot join the fleet yet") {
			return errors.New("no warning logged")
		}
		return nil
	})
}

func TestSetGenerationPropagates(t *testing.T) {
	a, b, c := threeMembers(t)
	changed := a.Changed()
	b.SetGeneration(7)
	if g := b.Local().Generation; g != 7 {
		t.Errorf("Local().Generation = %d after SetGeneration(7)", g)
	}
	select {
	case <-changed:
	case <-time.After(patience):
		t.Fatal("member 1's Changed not closed after member 2's generation changed")
	}
	for _, m := range []*member{a, b, c} {
		testwait.Eventually(t, patience, fmt.Sprintf("member %d sees generation 7 on member 2", m.id), func() error {
			if x, _ := m.stateOf(2); x.Generation != 7 {
				return fmt.Errorf("generation %d", x.Generation)
			}
			return nil
		})
	}
}

func TestKilledMemberTurnsSuspectThenDead(t *testing.T) {
	a, b, c := threeMembers(t)
	changed := a.Changed()
	c.kill()
	var mu sync.Mutex
	sawSuspect := map[int32]bool{}
	var wg sync.WaitGroup
	for _, m := range []*member{a, b} {
		wg.Go(func() {
			testwait.Eventually(t, patience, fmt.Sprintf("member %d sees 3 dead", m.id), func() error {
				x, ok := m.stateOf(3)
				if x.State == Suspect {
					mu.Lock()
					sawSuspect[m.id] = true
					mu.Unlock()
				}
				if !ok || x.State != Dead {
					return fmt.Errorf("members: %s", view(m.Members()))
				}
				return nil
			})
		})
	}
	wg.Wait()
	if len(sawSuspect) == 0 {
		t.Error("neither live member saw member 3 suspect before dead")
	}
	a.sees(1, 2)
	b.sees(1, 2)
	select {
	case <-changed:
	default:
		t.Error("Changed not closed")
	}
	testwait.Eventually(t, patience, "gauges", func() error {
		alive := testutil.ToFloat64(a.metrics.members.WithLabelValues("alive"))
		dead := testutil.ToFloat64(a.metrics.members.WithLabelValues("dead"))
		if alive != 2 || dead != 1 {
			return fmt.Errorf("ferry_fleet_members alive=%v dead=%v", alive, dead)
		}
		return nil
	})
}

func TestLeaveShowsLeftAndCloseIsIdempotent(t *testing.T) {
	a, b, c := threeMembers(t)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	select {
	case err := <-c.ran:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
		c.ran = nil
	case <-time.After(patience):
		t.Fatal("Run did not return after Close")
	}
	if ok, _ := c.Ready(); ok {
		t.Error("ready after Close")
	}
	for _, m := range []*member{a, b} {
		testwait.Eventually(t, patience, fmt.Sprintf("member %d sees 3 left", m.id), func() error {
			if x, ok := m.stateOf(3); !ok || x.State != Left {
				return fmt.Errorf("members: %s", view(m.Members()))
			}
			return nil
		})
		m.sees(1, 2)
	}
}

func TestRunEndsWithContext(t *testing.T) {
	a := newMember(t, testConfig("127.0.0.1:"+freePort(t)), testMeta(1))
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- a.Run(ctx) }()
	testwait.Eventually(t, patience, "a join attempt", func() error {
		if !a.logged(zapcore.WarnLevel, "cannot join") {
			return errors.New("none yet")
		}
		return nil
	})
	cancel()
	select {
	case <-ran:
	case <-time.After(patience):
		t.Fatal("Run did not return when its context ended")
	}
}

// A member restarted at its old address, with no seeds, is found again by
// a member whose seeds name that address once memberlist has forgotten it
// (gossip to the dead over): the rejoin of seeds that are not live members.
func TestRejoinHealsAfterDeadGossipEnds(t *testing.T) {
	cfg := testConfig()
	cfg.GossipToTheDeadTime = 300 * time.Millisecond
	port := freePort(t)
	cfg.Bind = "127.0.0.1:" + port
	a := start(t, cfg, testMeta(1))
	bcfg := testConfig(a.selfAddr)
	bcfg.GossipToTheDeadTime = cfg.GossipToTheDeadTime
	b := start(t, bcfg, testMeta(2))
	a.sees(1, 2)
	b.sees(1, 2)
	a.kill()
	testwait.Eventually(t, patience, "member 2 forgets member 1", func() error {
		if _, ok := b.stateOf(1); ok {
			return fmt.Errorf("members: %s", view(b.Members()))
		}
		return nil
	})
	a2 := start(t, cfg, testMeta(1)) // same address, no seeds
	a2.sees(1, 2)
	b.sees(1, 2)
	testwait.Eventually(t, patience, "member 2 logs its rejoin", func() error {
		if !b.logged(zapcore.InfoLevel, "joined seeds that were not live members") {
			return errors.New("no log")
		}
		return nil
	})
}

func TestNewErrors(t *testing.T) {
	a := newMember(t, testConfig(), testMeta(1))
	cfg := testConfig()
	cfg.Bind = a.selfAddr
	if _, err := New(cfg, testMeta(2), nil, nil); err == nil || !strings.Contains(err.Error(), "already in use") {
		t.Errorf("New on a bound address: %v", err)
	}
	bad := []struct {
		name string
		cfg  func(*Config)
		meta func(*Meta)
		want string
	}{
		{"no ports", nil, func(m *Meta) { m.Ports = nil }, "port"},
		{"port out of range", nil, func(m *Meta) { m.Ports = []int32{70000} }, "port"},
		{"no host", nil, func(m *Meta) { m.Host = "" }, "host"},
		{"meta too long", nil, func(m *Meta) { m.Version = strings.Repeat("v", 500) }, "512"},
		{"negative id", nil, func(m *Meta) { m.NodeID = -1 }, "negative"},
		{"profile", func(c *Config) { c.Profile = "wan2" }, nil, "profile"},
		{"key length", func(c *Config) { c.Key = []byte("short") }, nil, "key"},
		{"bind", func(c *Config) { c.Bind = "nowhere" }, nil, "bind"},
		{"advertise", func(c *Config) { c.Advertise = "host.example:7946" }, nil, "advertise"},
	}
	for _, tc := range bad {
		cfg, meta := testConfig(), testMeta(5)
		if tc.cfg != nil {
			tc.cfg(&cfg)
		}
		if tc.meta != nil {
			tc.meta(&meta)
		}
		f, err := New(cfg, meta, nil, nil)
		if err == nil {
			f.Close()
			t.Errorf("%s: New succeeded", tc.name)
		} else if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want it to mention %q", tc.name, err, tc.want)
		}
	}
}

func TestTwoFleetsOnOneRegistry(t *testing.T) {
	reg := prometheus.NewRegistry()
	for id := int32(1); id <= 2; id++ {
		f, err := New(testConfig(), testMeta(id), nil, reg)
		if err != nil {
			t.Fatalf("New(%d) on a shared registry: %v", id, err)
		}
		t.Cleanup(func() { f.Close() })
	}
	if n, err := testutil.GatherAndCount(reg, "ferry_fleet_members"); err != nil || n != 4 {
		t.Errorf("ferry_fleet_members series: %d, %v", n, err)
	}
}

// TestPushPullInterval: the LAN profile's push-pull interval is Ferry's
// (memberlist#263 makes it the bound on how late gossiped metadata can be),
// unless configured; the local profile keeps memberlist's.
func TestPushPullInterval(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want time.Duration
	}{
		{Config{Bind: "127.0.0.1:0"}, DefaultPushPullInterval},
		{Config{Bind: "127.0.0.1:0", PushPullInterval: 20 * time.Second}, 20 * time.Second},
		{Config{Bind: "127.0.0.1:0", Profile: "local"}, memberlist.DefaultLocalConfig().PushPullInterval},
	} {
		mc, err := memberlistConfig(c.cfg, "n")
		if err != nil {
			t.Fatal(err)
		}
		if mc.PushPullInterval != c.want {
			t.Errorf("%+v: push-pull %v, want %v", c.cfg, mc.PushPullInterval, c.want)
		}
	}
}
