package admin

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/ferry-gw/ferry/clientauth"
	"github.com/ferry-gw/ferry/routing"
)

// fakeClock is a clock the test moves.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// postFrom sends POST /switchover from remote with the Authorization header
// auth (none when empty).
func (f *fixture) postFrom(t *testing.T, remote, auth string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(http.MethodPost, "/switchover", strings.NewReader(`{"to": "standby"}`))
	req.RemoteAddr = remote
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	rec := httptest.NewRecorder()
	f.srv.Handler().ServeHTTP(rec, req)
	return rec
}

// Wrong admin tokens are counted, logged at most once per reason per
// interval, and limited per source address: past the allowance every token
// from that address is answered 429 with Retry-After, the right one too,
// until the allowance refills; another address is unaffected.
func TestAdminTokenGuessesLimited(t *testing.T) {
	core, logs := observer.New(zapcore.WarnLevel)
	sw := &fakeSwitch{}
	f := newFixture(t, WithSwitch(sw.fn), WithToken(testToken), WithLogger(zap.New(core)))
	sw.do = switchedTo(f.routes, routing.Planned)
	clock := &fakeClock{t: time.Now()}
	f.srv.tokens = clientauth.NewTokenBuckets(DefaultTokenFailureBurst, DefaultTokenFailureInterval, tokenGuardMax, clock.now)

	const guesser, other = "203.0.113.9:40000", "198.51.100.7:5555"
	const wrong = 50
	start := time.Now()
	limited := 0
	for i := range wrong {
		rec := f.postFrom(t, guesser, "Bearer guess-"+strconv.Itoa(i))
		switch {
		case i < DefaultTokenFailureBurst && rec.Code == http.StatusUnauthorized && decodeError(t, rec).Error == ReasonUnauthorized:
		case i >= DefaultTokenFailureBurst && rec.Code == http.StatusTooManyRequests && decodeError(t, rec).Error == ReasonRateLimited:
			if ra, err := strconv.Atoi(rec.Header().Get("Retry-After")); err != nil || ra < 1 {
				t.Fatalf("guess %d: Retry-After %q, want whole seconds", i, rec.Header().Get("Retry-After"))
			}
			limited++
		default:
			t.Fatalf("guess %d: %d %s", i, rec.Code, rec.Body)
		}
	}
	// The right token from the guesser waits as well.
	if rec := f.postFrom(t, guesser, "Bearer "+testToken); rec.Code != http.StatusTooManyRequests {
		t.Fatalf("the right token from an address out of allowance: %d %s, want 429", rec.Code, rec.Body)
	}
	if n := sw.calls.Load(); n != 0 {
		t.Fatalf("the switch ran %d times", n)
	}
	// Another address is unaffected.
	if rec := f.postFrom(t, other, "Bearer "+testToken); rec.Code != http.StatusOK {
		t.Fatalf("the right token from another address: %d %s", rec.Code, rec.Body)
	}
	metricsHas(t, f,
		`ferry_admin_auth_failures_total{reason="invalid_token"} `+strconv.Itoa(DefaultTokenFailureBurst),
		`ferry_admin_auth_failures_total{reason="rate_limited"} `+strconv.Itoa(limited+1),
		`ferry_admin_auth_failures_total{reason="no_token"} 0`)
	// 51 refusals, one line per reason per interval.
	if n, most := logs.FilterMessage("admin request refused").Len(), sampledLines(2, start); n < 2 || n > most {
		t.Errorf("%d log lines for %d refusals, want 2 to %d (one per reason per interval):\n%v", n, wrong+1, most, logs.All())
	}

	// Once the allowance refills, the right token works from the guesser.
	clock.advance(DefaultTokenFailureInterval)
	f.routes.Advance(routing.State{Generation: f.routes.Current().Generation + 1, Active: "primary"})
	if rec := f.postFrom(t, guesser, "Bearer "+testToken); rec.Code != http.StatusOK {
		t.Fatalf("the right token after the allowance refilled: %d %s", rec.Code, rec.Body)
	}
}

// sampledLines is the most lines the refusal log writes about reasons
// since start: one per reason per interval.
func sampledLines(reasons int, start time.Time) int {
	return reasons * (1 + int(time.Since(start)/refusalLogInterval))
}

// Asking without a token is counted, but spends no allowance: it guesses
// nothing.
func TestAdminNoTokenCounted(t *testing.T) {
	sw := &fakeSwitch{}
	f := newFixture(t, WithSwitch(sw.fn), WithToken(testToken))
	sw.do = switchedTo(f.routes, routing.Planned)
	for range 3 * DefaultTokenFailureBurst {
		if rec := f.postFrom(t, "203.0.113.9:1", ""); rec.Code != http.StatusUnauthorized {
			t.Fatalf("no token: %d %s", rec.Code, rec.Body)
		}
	}
	if rec := f.postFrom(t, "203.0.113.9:1", "Bearer "+testToken); rec.Code != http.StatusOK {
		t.Fatalf("the token after requests without one: %d %s", rec.Code, rec.Body)
	}
	metricsHas(t, f, `ferry_admin_auth_failures_total{reason="no_token"} `+strconv.Itoa(3*DefaultTokenFailureBurst))
}

// The per-address bounds count an IPv4 address, and an IPv6 address by its
// /64: one host usually holds a whole /64.
func TestSourceOf(t *testing.T) {
	for in, want := range map[string]string{
		"203.0.113.9:40000":                 "203.0.113.9",
		"[2001:db8:1:2:aaaa::1]:443":        "2001:db8:1:2::/64",
		"[2001:db8:1:2:ffff:ffff:ffff:1]:1": "2001:db8:1:2::/64",
		"[::ffff:203.0.113.9]:40000":        "203.0.113.9",
		"[::1]:9644":                        "::/64",
		"not-an-address":                    "not-an-address",
	} {
		if got := sourceOf(in); got != want {
			t.Errorf("sourceOf(%q) = %q, want %q", in, got, want)
		}
	}
	// Two addresses of one /64 share the allowance of wrong tokens.
	sw := &fakeSwitch{}
	f := newFixture(t, WithSwitch(sw.fn), WithToken(testToken), WithTokenFailureLimit(2, time.Hour))
	for i := range 2 {
		if rec := f.postFrom(t, fmt.Sprintf("[2001:db8:1:2::%d]:1", i+1), "Bearer wrong"); rec.Code != http.StatusUnauthorized {
			t.Fatalf("wrong token %d of the allowance from the /64: %d, want 401", i+1, rec.Code)
		}
	}
	if rec := f.postFrom(t, "[2001:db8:1:2::99]:1", "Bearer wrong"); rec.Code != http.StatusTooManyRequests {
		t.Fatalf("a third wrong token from the same /64: %d, want 429", rec.Code)
	}
	if rec := f.postFrom(t, "[2001:db8:1:3::1]:1", "Bearer wrong"); rec.Code != http.StatusUnauthorized {
		t.Fatalf("a wrong token from another /64: %d, want 401", rec.Code)
	}
}

// Wrong tokens sent at once from one address are compared no more than
// the allowance: each spends its unit before it is compared.
func TestAdminTokenGuessesAtOnce(t *testing.T) {
	sw := &fakeSwitch{}
	f := newFixture(t, WithSwitch(sw.fn), WithToken(testToken))
	clock := &fakeClock{t: time.Now()}
	f.srv.tokens = clientauth.NewTokenBuckets(DefaultTokenFailureBurst, DefaultTokenFailureInterval, tokenGuardMax, clock.now)
	const guesses = 200
	codes := make(chan int, guesses)
	var wg sync.WaitGroup
	for i := range guesses {
		wg.Go(func() { codes <- f.postFrom(t, "203.0.113.9:40000", "Bearer guess-"+strconv.Itoa(i)).Code })
	}
	wg.Wait()
	close(codes)
	byCode := map[int]int{}
	for c := range codes {
		byCode[c]++
	}
	if byCode[http.StatusUnauthorized] != DefaultTokenFailureBurst || byCode[http.StatusTooManyRequests] != guesses-DefaultTokenFailureBurst {
		t.Fatalf("%d wrong tokens at once answered %v, want %d compared (401) and the rest 429", guesses, byCode, DefaultTokenFailureBurst)
	}
}
