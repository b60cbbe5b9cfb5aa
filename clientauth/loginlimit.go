package clientauth

// Login limits (auth.go). Two token buckets bound authentication
// attempts: one per (user, source address), FailedBurst tokens, and one per
// source address, FailedAddressBurst. A token is taken when an exchange
// starts, before any credential is checked, and given back when it
// succeeds: what stays taken is the failed and the abandoned exchanges,
// and the ones in progress. Taking at the start rather than counting at
// the failure is what makes the limit hold against a client that opens
// many connections and sends every first message before any proof: each
// exchange needs its token to go on, so at most the burst of proofs is
// ever checked. The per-user bucket locks a guessed user out from the
// guessing address only: the same user elsewhere, and other users at the
// same address (behind one NAT), log in. The per-address bucket bounds the
// work one address can cause by trying many user names.
//
// A client out of tokens waits up to DefaultAdmitWait for one, given
// back by an exchange that succeeded or refilled, so that many clients of
// one user starting at once (a service restarting behind a NAT) queue for
// the burst rather than fail; then it is refused as rate_limited. The
// burst is then how many exchanges of one user at one address run at
// once: a herd of N clients needs about N/burst exchange times within the
// wait.
//
// golang.org/x/time/rate is not used: its buckets cannot take a token
// back once its time has come (Reservation.Cancel only restores future
// reservations), which is what a successful exchange needs.

import (
	"context"
	"crypto/sha256"
	"fmt"
	"sync"
	"time"
)

// DefaultAdmitWait bounds how long an exchange waits for a token: long
// enough for a herd of a few hundred clients at LAN round trips, well
// within the 30 s request timeout of clients.
const DefaultAdmitWait = 5 * time.Second

// loginLimiterMax bounds the keys a login limiter tracks: beyond it,
// buckets that have refilled are forgotten, or else the fullest.
const loginLimiterMax = 100_000

// TokenBuckets is a token bucket per key, whose tokens can be given back
// (Refund). The logins are limited with it, and so are the admin API's
// wrong tokens, per source address.
type TokenBuckets struct {
	burst    float64
	interval time.Duration
	max      int // keys tracked at most
	now      func() time.Time

	mu      sync.Mutex
	buckets map[string]*loginBucket
}

type loginBucket struct {
	tokens float64
	at     time.Time
	// freed is made by a client waiting for a token and closed when one
	// is given back.
	freed chan struct{}
}

// NewTokenBuckets returns buckets of burst tokens, refilled at burst per
// interval, tracking at most maxKeys keys: beyond, the buckets that have
// refilled are forgotten, or else the fullest. now is the clock (nil:
// time.Now).
func NewTokenBuckets(burst int, interval time.Duration, maxKeys int, now func() time.Time) *TokenBuckets {
	if now == nil {
		now = time.Now
	}
	return &TokenBuckets{burst: float64(burst), interval: interval, max: maxKeys, now: now, buckets: map[string]*loginBucket{}}
}

// refill brings b up to now; l.mu is held.
func (l *TokenBuckets) refill(b *loginBucket, now time.Time) {
	b.tokens = min(l.burst, b.tokens+float64(now.Sub(b.at))/float64(l.interval)*l.burst)
	b.at = now
}

// Take takes a token of key's bucket. Without one it returns when the
// next refills, and a channel closed when one is given back sooner.
func (l *TokenBuckets) Take(key string) (ok bool, retry time.Duration, freed <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	b := l.buckets[key]
	if b == nil {
		if len(l.buckets) >= l.max {
			l.prune(now)
		}
		b = &loginBucket{tokens: l.burst, at: now}
		l.buckets[key] = b
	}
	l.refill(b, now)
	if b.tokens >= 1 {
		b.tokens--
		return true, 0, nil
	}
	if b.freed == nil {
		b.freed = make(chan struct{})
	}
	return false, time.Duration((1 - b.tokens) / l.burst * float64(l.interval)), b.freed
}

// Refund gives back a token taken from key's bucket.
func (l *TokenBuckets) Refund(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.buckets[key]
	if b == nil {
		return // forgotten, so full again
	}
	l.refill(b, l.now())
	b.tokens = min(l.burst, b.tokens+1)
	if b.freed != nil {
		close(b.freed)
		b.freed = nil
	}
}

// prune forgets the buckets that are full again, and the fullest if none
// is; l.mu is held.
func (l *TokenBuckets) prune(now time.Time) {
	fullest, most := "", -1.0
	for key, b := range l.buckets {
		l.refill(b, now)
		if b.tokens >= l.burst {
			delete(l.buckets, key)
			continue
		}
		if b.tokens > most {
			fullest, most = key, b.tokens
		}
	}
	if len(l.buckets) >= l.max {
		if b := l.buckets[fullest]; b.freed != nil {
			close(b.freed) // its waiters take from a new bucket
		}
		delete(l.buckets, fullest)
	}
}

// Admission is an exchange's tokens, given back if it succeeds.
type Admission struct {
	addr    string
	userKey string // "" until the user is known, and for OAUTHBEARER
}

// userLimitKey keys the per-user bucket of user at addr: the name hashed,
// so that long names cost no more memory than short ones.
func userLimitKey(addr, user string) string {
	h := sha256.Sum256([]byte(user))
	return addr + "\x00" + string(h[:16])
}

// AdmitAddr takes the address's token for an exchange starting.
func (a *Authenticator) AdmitAddr(ctx context.Context, addr string) (*Admission, *Failure) {
	if f := a.wait(ctx, a.perAddr, addr, "from "+addr); f != nil {
		return nil, f
	}
	return &Admission{addr: addr}, nil
}

// AdmitUser takes the token of the user the exchange names; refused, it
// gives the address's back, as nothing was checked.
func (a *Authenticator) AdmitUser(ctx context.Context, adm *Admission, user string) *Failure {
	key := userLimitKey(adm.addr, user)
	if f := a.wait(ctx, a.perUser, key, "for this user from "+adm.addr); f != nil {
		a.perAddr.Refund(adm.addr)
		adm.addr = ""
		return f
	}
	adm.userKey = key
	return nil
}

// Release gives back the tokens of an exchange that succeeded.
func (a *Authenticator) Release(adm *Admission) {
	if adm == nil {
		return
	}
	if adm.addr != "" {
		a.perAddr.Refund(adm.addr)
	}
	if adm.userKey != "" {
		a.perUser.Refund(adm.userKey)
	}
	adm.addr, adm.userKey = "", ""
}

// wait takes a token of key in l, waiting up to DefaultAdmitWait for one.
func (a *Authenticator) wait(ctx context.Context, l *TokenBuckets, key, who string) *Failure {
	deadline := time.Now().Add(a.cfg.AdmitWait)
	for {
		ok, retry, freed := l.Take(key)
		if ok {
			return nil
		}
		left := time.Until(deadline)
		if left <= 0 {
			return &Failure{Reason: "rate_limited", Msg: fmt.Sprintf("too many failed authentications %s: retry in %s", who, retry.Round(time.Second)+time.Second)}
		}
		t := time.NewTimer(min(left, retry))
		select {
		case <-freed:
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return &Failure{Reason: "rate_limited", Msg: "the connection closed while waiting to authenticate", Err: ctx.Err()}
		}
		t.Stop()
	}
}
