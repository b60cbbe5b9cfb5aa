package admin

import (
	"math"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"time"

	"go.uber.org/zap"
)

// Token guessing is limited per source address: DefaultTokenFailureBurst
// wrong tokens, then that many per DefaultTokenFailureInterval. An address out of
// allowance has every request that carries a token answered 429, the right
// token too (otherwise the limit would not slow a guesser down); its
// requests without a token (/metrics, probes) and every other address are
// unaffected.
const (
	DefaultTokenFailureBurst    = 10
	DefaultTokenFailureInterval = time.Minute
)

// Reasons of ferry_admin_auth_failures_total, besides ReasonRateLimited.
const (
	authNoToken      = "no_token"      // an endpoint that needs the token, asked without one
	authInvalidToken = "invalid_token" // a token that is not the admin token
)

// ReasonRateLimited is the error of a 429 answer, and the reason it is
// counted under: a token from an address out of allowance, not compared.
const ReasonRateLimited = "rate_limited"

// refusalLogInterval: at most one line per reason per interval about
// refused tokens and connections; the metrics count every one.
const refusalLogInterval = 10 * time.Second

// tokenGuardMax bounds the addresses tracked: beyond it, those whose
// allowance has refilled are forgotten, or else the fullest.
const tokenGuardMax = 10_000

// WithTokenFailureLimit sets the per-address allowance of wrong tokens:
// burst, then burst per interval (default DefaultTokenFailureBurst per
// DefaultTokenFailureInterval).
func WithTokenFailureLimit(burst int, interval time.Duration) Option {
	return func(c *config) { c.tokenBurst, c.tokenInterval = burst, interval }
}

// remoteIP is the source a request's remote address counts against.
func remoteIP(r *http.Request) string { return sourceOf(r.RemoteAddr) }

// sourceOf is the source an address (host:port) counts against in the
// per-address bounds: its IP, or for IPv6 its /64, which one host usually
// holds whole (counting each address would let it spread over 2^64).
func sourceOf(hostport string) string {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return host
	}
	if ip.Is6() && !ip.Is4In6() {
		p, _ := ip.Prefix(64)
		return p.String()
	}
	return ip.Unmap().String()
}

// credential is what a request proved.
type credential int

const (
	credNone credential = iota // no token (nor certificate) given
	credFull                   // the token, a verified client certificate, or no token configured
)

// redacts reports whether a request that proved cred is answered without
// the personal fields (RedactedFields, StatusRedactedFields).
func (s *Server) redacts(cred credential) bool { return cred != credFull && !s.cfg.publicRead }

// authenticate checks a request's credential. A wrong token, or any token
// from an address out of allowance, is answered here (401, 429) and ok is
// false; otherwise the caller decides what credNone may do.
func (s *Server) authenticate(w http.ResponseWriter, r *http.Request) (cred credential, ok bool) {
	if s.cfg.token == "" || hasVerifiedCert(r) {
		return credFull, true
	}
	if r.Header.Get("Authorization") == "" {
		return credNone, true
	}
	// One unit of the address's allowance is spent before the token is
	// compared, so that requests sent at once cannot all be compared on
	// one remaining unit; a right token gives it back.
	ip := remoteIP(r)
	if ok, wait, _ := s.tokens.Take(ip); !ok {
		s.refuseToken(w, r, ReasonRateLimited, wait, "")
		return credNone, false
	}
	if s.hasToken(r) {
		s.tokens.Refund(ip)
		return credFull, true
	}
	s.refuseToken(w, r, authInvalidToken, 0, "")
	return credNone, false
}

// refuseToken counts, logs (sampled) and answers a refused request: 429
// with Retry-After for rate_limited, else 401 with msg (empty: the
// reason's own).
func (s *Server) refuseToken(w http.ResponseWriter, r *http.Request, reason string, retry time.Duration, msg string) {
	s.authFailures.WithLabelValues(reason).Inc()
	if n, ok := s.refusalLogs.Allow("token:" + reason); ok {
		s.cfg.log.Warn("admin request refused", zap.String("reason", reason), zap.String("method", r.Method),
			zap.String("path", r.URL.Path), zap.String("remote", r.RemoteAddr), zap.Int("not_logged_since_last", n))
	}
	if reason == ReasonRateLimited {
		secs := int(math.Ceil(retry.Seconds()))
		w.Header().Set("Retry-After", strconv.Itoa(secs))
		writeJSON(w, http.StatusTooManyRequests, ErrorBody{Error: ReasonRateLimited,
			Message: "too many wrong admin tokens from " + remoteIP(r) + ": retry in " + strconv.Itoa(secs) + "s"})
		return
	}
	w.Header().Set("WWW-Authenticate", `Bearer realm="ferry"`)
	switch {
	case msg != "":
	case reason == authInvalidToken:
		msg = "the admin token is not valid"
	default:
		msg = "this endpoint needs the admin token: Authorization: Bearer <token>"
	}
	writeJSON(w, http.StatusUnauthorized, ErrorBody{Error: ReasonUnauthorized, Message: msg})
}
