package membership

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"go.uber.org/zap/zapcore"

	"github.com/ferry-gw/ferry/internal/testwait"
)

func TestDuplicateNodeIDRefusedUntilTheOldIsDead(t *testing.T) {
	a, b, c := threeMembers(t)
	oldAddr := b.selfAddr
	d := start(t, testConfig(a.selfAddr), testMeta(2)) // member 2 again, elsewhere

	testwait.Eventually(t, patience, "the duplicate refused on both sides, and retrying", func() error {
		ok, reason := d.Ready()
		if ok || !strings.Contains(reason, "node ID 2") {
			return fmt.Errorf("joiner Ready() = %v, %q", ok, reason)
		}
		if !a.logged(zapcore.WarnLevel, "node ID 2 is held by the live member at "+oldAddr) {
			return errors.New("the seed logged no refusal")
		}
		if !d.logged(zapcore.WarnLevel, "cannot join the fleet yet") || d.logs.FilterMessageSnippet("cannot join the fleet yet").Len() < 2 {
			return errors.New("the joiner did not retry")
		}
		return nil
	})
	for _, m := range []*member{a, b, c} {
		if x, _ := m.stateOf(2); x.Addr != oldAddr || x.State != Alive {
			t.Errorf("member %d sees 2 as %s/%s, want the original at %s", m.id, x.Addr, x.State, oldAddr)
		}
		m.sees(1, 2, 3)
	}
	if got := d.Alive(); len(got) != 1 || !got[0].Self {
		t.Errorf("the refused member sees %s", view(got))
	}

	// The original dies (a pod gone, its replacement at a new IP): the
	// newcomer gets in and everyone sees member 2 at its address.
	b.kill()
	testwait.Eventually(t, patience, "the newcomer ready", func() error {
		if ok, reason := d.Ready(); !ok {
			return errors.New(reason)
		}
		return nil
	})
	for _, m := range []*member{a, c, d} {
		testwait.Eventually(t, patience, fmt.Sprintf("member %d sees 2 at the new address", m.id), func() error {
			if x, _ := m.stateOf(2); x.Addr != d.selfAddr || x.State != Alive {
				return fmt.Errorf("members: %s", view(m.Members()))
			}
			return nil
		})
		m.sees(1, 2, 3)
	}
}

func TestRestartAtSameAddress(t *testing.T) {
	a := start(t, testConfig(), testMeta(1))
	port := freePort(t)
	cfg := testConfig(a.selfAddr)
	cfg.Bind = "127.0.0.1:" + port
	b := start(t, cfg, testMeta(2))
	a.sees(1, 2)
	b.kill() // before anyone notices
	b2 := start(t, cfg, testMeta(2))
	b2.Handle("echo", func(ctx context.Context, from int32, body []byte) ([]byte, error) { return []byte("back"), nil })
	a.sees(1, 2)
	b2.sees(1, 2)
	testwait.Eventually(t, patience, "a call to the restarted member", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := a.Call(ctx, 2, "echo", nil)
		return err
	})
}

func key(b byte) []byte { return bytes.Repeat([]byte{b}, 32) }

func TestWrongOrMissingKeyRefused(t *testing.T) {
	cfg := testConfig()
	cfg.Key = key(1)
	a := start(t, cfg, testMeta(1))
	cfg = testConfig(a.selfAddr)
	cfg.Key = key(1)
	b := start(t, cfg, testMeta(2))
	handlers(b)
	a.sees(1, 2)
	b.sees(1, 2)

	cfg = testConfig(a.selfAddr)
	cfg.Key = key(2)
	c := start(t, cfg, testMeta(3))
	d := start(t, testConfig(a.selfAddr), testMeta(4)) // no key at all

	testwait.Eventually(t, patience, "both outsiders refused, and logged by the keyed member", func() error {
		for _, m := range []*member{c, d} {
			if ok, _ := m.Ready(); ok || m.logs.FilterMessageSnippet("cannot join the fleet yet").Len() < 2 {
				return fmt.Errorf("member %d: Ready()=%v after %d attempts", m.id, ok, m.logs.FilterMessageSnippet("cannot join the fleet yet").Len())
			}
		}
		if !a.logged(zapcore.ErrorLevel, "no installed keys could decrypt") {
			return errors.New("member 1 did not log the wrong key")
		}
		if !a.logged(zapcore.ErrorLevel, "encryption is configured but remote state is not encrypted") {
			return errors.New("member 1 did not log the missing key")
		}
		return nil
	})
	if _, reason := c.Ready(); !strings.Contains(reason, "decrypt") {
		t.Errorf("member with the wrong key: %s", reason)
	}
	if _, reason := d.Ready(); !strings.Contains(reason, "encryption is not configured") {
		t.Errorf("member without a key: %s", reason)
	}
	a.sees(1, 2)
	b.sees(1, 2)
	c.sees(3)
	d.sees(4)
	// The keyed fleet still works, calls included.
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	if got, err := a.Call(ctx, 2, "echo", []byte("k")); err != nil || string(got) != "2 got k from 1" {
		t.Errorf("Call over the keyed fleet = %q, %v", got, err)
	}
}

// Garbage sent to the gossip port, over UDP and TCP, in plaintext (so
// that it reaches memberlist's decoding and the fleet's), leaves the
// fleet working.
func TestGarbageOnTheGossipPort(t *testing.T) {
	a, b, _ := threeMembers(t)
	handlers(b)
	rng := rand.New(rand.NewPCG(1, 2))
	junk := func(n int) []byte {
		p := make([]byte, n)
		for i := range p {
			p[i] = byte(rng.UintN(256))
		}
		return p
	}
	withLabel := func(p []byte) []byte { return append([]byte{244, byte(len(label))}, append([]byte(label), p...)...) }
	var payloads [][]byte
	for _, n := range []int{0, 1, 2, 7, 64, 1000} {
		payloads = append(payloads, junk(n))
	}
	for typ := byte(0); typ < 14; typ++ { // every memberlist message type, then junk
		payloads = append(payloads, withLabel(append([]byte{typ}, junk(40)...)))
		payloads = append(payloads, append([]byte{typ}, junk(40)...))
	}
	// A fleet message that is not one: a user message (8) with our
	// version byte and nonsense after it, and one with a huge length.
	payloads = append(payloads,
		withLabel(append([]byte{8, wireVersion, msgRequest}, junk(30)...)),
		withLabel([]byte{8, wireVersion, msgResponse, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}),
		withLabel(append([]byte{8}, (&message{typ: msgRequest, id: 1, from: 77, kind: "echo"}).encode()...)),
	)

	udp, err := net.Dial("udp", a.selfAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer udp.Close()
	for _, p := range payloads {
		if _, err := udp.Write(p); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range payloads {
		conn, err := net.DialTimeout("tcp", a.selfAddr, 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = conn.Write(p)
		_ = conn.Close()
	}
	// A connection that says nothing and one that stops half-way stay open
	// while the fleet goes on.
	idle, err := net.Dial("tcp", a.selfAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	half, err := net.Dial("tcp", a.selfAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer half.Close()
	_, _ = half.Write(withLabel([]byte{byte(6)}))

	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	if got, err := a.Call(ctx, 2, "echo", []byte("still")); err != nil || string(got) != "2 got still from 1" {
		t.Errorf("Call after garbage = %q, %v", got, err)
	}
	b.SetGeneration(3)
	testwait.Eventually(t, patience, "generation gossiped after garbage", func() error {
		if x, _ := a.stateOf(2); x.Generation != 3 {
			return fmt.Errorf("generation %d", x.Generation)
		}
		return nil
	})
	a.sees(1, 2, 3)
	if ok, reason := a.Ready(); !ok {
		t.Errorf("not ready after garbage: %s", reason)
	}
}

func TestLoadKey(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	k := key(7)
	enc := base64.StdEncoding.EncodeToString(k)
	got, err := LoadKey(write("ok", "  "+enc[:10]+"\n"+enc[10:]+" \n"))
	if err != nil || !bytes.Equal(got, k) {
		t.Errorf("LoadKey(valid) = %x, %v", got, err)
	}
	for _, n := range []int{16, 24} {
		if got, err := LoadKey(write("n", base64.StdEncoding.EncodeToString(key(1)[:n]))); err != nil || len(got) != n {
			t.Errorf("LoadKey(%d bytes) = %d bytes, %v", n, len(got), err)
		}
	}
	for _, tc := range []struct{ name, content, want string }{
		{"empty", " \n", "empty"},
		{"notbase64", "not*base64!", "base64"},
		{"short", base64.StdEncoding.EncodeToString([]byte("0123456789")), "10 bytes"},
	} {
		if _, err := LoadKey(write(tc.name, tc.content)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("LoadKey(%s) error = %v, want it to mention %q", tc.name, err, tc.want)
		}
	}
	if _, err := LoadKey(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("LoadKey(missing) error = %v", err)
	}
}

func TestMessageCodec(t *testing.T) {
	for _, m := range []message{
		{typ: msgRequest, id: 1<<63 + 5, from: 2147483647, kind: "hold", timeout: 1500, body: []byte("body")},
		{typ: msgResponse, id: 0, from: 0, err: "member says no"},
		{typ: msgResponse, id: 9, from: 3},
		{typ: msgBusy, id: 10, from: 3, err: "member 3 has 64 calls of this lane in progress"},
	} {
		got, err := decodeMessage(m.encode())
		if err != nil {
			t.Errorf("decode(encode(%+v)): %v", m, err)
			continue
		}
		if got.typ != m.typ || got.id != m.id || got.from != m.from || got.kind != m.kind || got.timeout != m.timeout ||
			got.err != m.err || !bytes.Equal(got.body, m.body) {
			t.Errorf("round trip: %+v, want %+v", got, m)
		}
	}
	full := (&message{typ: msgRequest, id: 300, from: 4, kind: "install", timeout: 20, err: "", body: []byte("xyz")}).encode()
	for i := 0; i < len(full)-3; i++ { // every truncation short of the body
		if _, err := decodeMessage(full[:i]); err == nil {
			t.Errorf("decoded a message truncated to %d bytes", i)
		}
	}
}

func FuzzDecodeMessage(f *testing.F) {
	f.Add((&message{typ: msgRequest, id: 1, from: 1, kind: "k", body: []byte("b")}).encode())
	f.Add([]byte{wireVersion, msgResponse, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeMessage(b)
		if err != nil {
			return
		}
		again, err := decodeMessage(m.encode())
		if err != nil || again.id != m.id || again.kind != m.kind || !bytes.Equal(again.body, m.body) {
			t.Errorf("re-encoding %+v: %+v, %v", m, again, err)
		}
	})
}

// Gossip about a member (not a join) goes through NotifyAlive: news of a
// second member 2 elsewhere, or of a node that is not a Ferry member, is
// ignored; news of member 2 where it is, or of a new member, is not.
func TestNotifyAliveRefusesDuplicates(t *testing.T) {
	a := start(t, testConfig(), testMeta(1))
	b := start(t, testConfig(a.selfAddr), testMeta(2))
	a.sees(1, 2)
	metaOf := func(m Meta) []byte {
		js, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return js
	}
	host, ps, _ := net.SplitHostPort(b.selfAddr)
	port, _ := strconv.Atoi(ps)
	node := func(name string, port int, meta []byte) *memberlist.Node {
		return &memberlist.Node{Name: name, Addr: net.ParseIP(host), Port: uint16(port), Meta: meta}
	}
	d := delegate{a.Fleet}
	if err := d.NotifyAlive(node("2", port, metaOf(testMeta(2)))); err != nil {
		t.Errorf("member 2 where it is: %v", err)
	}
	if err := d.NotifyAlive(node("2", port+1, metaOf(testMeta(2)))); err == nil || !strings.Contains(err.Error(), "node ID 2 is held by the live member at "+b.selfAddr) {
		t.Errorf("a second member 2: %v", err)
	}
	if err := d.NotifyAlive(node("7", port+1, metaOf(testMeta(7)))); err != nil {
		t.Errorf("a new member: %v", err)
	}
	if err := d.NotifyAlive(node("7", port+1, metaOf(testMeta(8)))); err == nil {
		t.Error("a node whose metadata names another node ID was let in")
	}
	if err := d.NotifyAlive(node("serf-agent", port+1, []byte("role=web"))); err == nil {
		t.Error("a node that is not a Ferry member was let in")
	}
	b.kill()
	testwait.Eventually(t, patience, "member 2 dead", func() error {
		if x, _ := a.stateOf(2); x.State != Dead {
			return fmt.Errorf("members: %s", view(a.Members()))
		}
		return nil
	})
	if err := d.NotifyAlive(node("2", port+1, metaOf(testMeta(2)))); err != nil {
		t.Errorf("member 2 back at a new address once the old is dead: %v", err)
	}
}
