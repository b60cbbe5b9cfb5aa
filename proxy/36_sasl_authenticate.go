package proxy

// SaslAuthenticate (key 36), v0-v2, advertised only with SASL on the
// listeners (auth.go): one round of the mechanism chosen by SaslHandshake
// per request. Answered by Ferry; nothing reaches a cluster. v1 and later
// answer a session lifetime of 0: Ferry asks for no re-authentication
// (KIP-368), so a client never sends a second handshake on a connection.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferry-gw/ferry/protocol"
)

var saslAuthenticateVersions = protocol.VersionRange{Min: 0, Max: 2}

func handleSASLAuthenticate(s *Server, c *clientConn, req *request, kr kmsg.Request) (*reply, error) {
	in := kr.(*kmsg.SASLAuthenticateRequest)
	resp := kmsg.NewPtrSASLAuthenticateResponse()
	mech := c.auth.mechanism
	fail := func(f *authFailure) (*reply, error) {
		s.authFailed(c, mech, f)
		resp.ErrorCode = kerr.SaslAuthenticationFailed.Code
		msg := fmt.Sprintf("Authentication failed during authentication due to %s with SASL mechanism %s", f.msg, mech)
		if f.reason == "rate_limited" {
			msg = f.msg
		}
		resp.ErrorMessage = &msg
		delay := s.auth.cfg.FailedDelay
		return futureReply(req, func(ctx context.Context) (kmsg.Response, func(), error) {
			t := time.NewTimer(delay)
			defer t.Stop()
			select {
			case <-t.C:
			case <-ctx.Done():
				return nil, nil, ctx.Err()
			}
			return resp, nil, nil
		}), nil
	}
	switch {
	case s.auth == nil:
		// Not advertised: dispatch refuses it first.
		return nil, errors.New("SaslAuthenticate without SASL")
	case c.auth.done || mech == "":
		s.authMetrics.failed(mech, "illegal_state")
		resp.ErrorCode = kerr.IllegalSaslState.Code
		msg := "SaslAuthenticate before a SaslHandshake"
		if c.auth.done {
			msg = "the connection is already authenticated"
		} else {
			c.auth.closeAfter = fmt.Errorf("%w: %s", errAuthFailed, msg)
		}
		resp.ErrorMessage = &msg
		return localReply(req, resp), nil
	}
	first := c.auth.admission == nil
	if first {
		// The exchange starts: it takes its address's token before
		// anything is checked (loginlimit.go), and each later round
		// goes on under the tokens it holds.
		adm, f := s.auth.admitAddr(c.ctx, c.ip)
		if f != nil {
			return fail(f)
		}
		c.auth.admission = adm
	}
	var out []byte
	done, principal := false, ""
	switch mech {
	case MechanismPlain:
		user, password, f := parsePlain(in.SASLAuthBytes)
		if f == nil {
			f = s.auth.admitUser(c.ctx, c.auth.admission, user)
		}
		if f == nil {
			f = s.auth.plain(user, password)
		}
		if f != nil {
			return fail(f)
		}
		done, principal = true, user
	case MechanismSCRAMSHA256, MechanismSCRAMSHA512:
		if first {
			c.auth.scram = newSCRAMServer(mech, func(u string) (SCRAMCredential, bool) { return s.auth.store.lookup(u, mech) },
				func(u string) SCRAMCredential { return s.auth.fakeCredential(u, mech) })
		}
		var err error
		if out, done, err = c.auth.scram.next(in.SASLAuthBytes); err != nil {
			var f *authFailure
			if !errors.As(err, &f) {
				f = &authFailure{reason: "malformed", msg: err.Error()}
			}
			return fail(f)
		}
		if first {
			// The user is known from client-first: its token is taken
			// before the server-first that lets the client send a proof.
			if f := s.auth.admitUser(c.ctx, c.auth.admission, c.auth.scram.user); f != nil {
				return fail(f)
			}
		}
		principal = c.auth.scram.user
	case MechanismOAuthBearer:
		// A token is not guessed like a password: the address's bucket
		// alone bounds the work.
		token, err := parseOAuthBearer(in.SASLAuthBytes)
		if err != nil {
			return fail(&authFailure{reason: "malformed", msg: err.Error()})
		}
		p, f := s.auth.oauth.validate(token)
		if f != nil {
			return fail(f)
		}
		done, principal = true, p
	}
	resp.SASLAuthBytes = out
	if done {
		if s.refusesUnmapped("User:" + principal) {
			return fail(unmappedFailure("User:" + principal))
		}
		s.authSucceeded(c, mech, "User:"+principal)
	}
	return localReply(req, resp), nil
}

// parsePlain reads a SASL/PLAIN message (RFC 4616: authzid NUL authcid
// NUL passwd).
func parsePlain(msg []byte) (user, password string, f *authFailure) {
	parts := strings.Split(string(msg), "\x00")
	if len(parts) != 3 || parts[1] == "" {
		return "", "", &authFailure{reason: "malformed", msg: "invalid PLAIN message"}
	}
	authzid, user, password := parts[0], parts[1], parts[2]
	if authzid != "" && authzid != user {
		return "", "", &authFailure{reason: "authzid", user: user, msg: "an authorization identity other than the user's own is not supported"}
	}
	return user, password, nil
}

// plain checks a PLAIN password against the user's SCRAM-SHA-512
// credential, else its SCRAM-SHA-256 one.
func (a *authenticator) plain(user, password string) *authFailure {
	for _, mech := range []string{MechanismSCRAMSHA512, MechanismSCRAMSHA256} {
		if cred, ok := a.store.lookup(user, mech); ok {
			if !cred.verifyPassword(mech, password) {
				return &authFailure{reason: "bad_password", user: user, msg: "invalid credentials"}
			}
			return nil
		}
	}
	// As long as a wrong password takes, so timing does not tell.
	a.fakeCredential(user, MechanismSCRAMSHA512).verifyPassword(MechanismSCRAMSHA512, password)
	return &authFailure{reason: "unknown_user", user: user, msg: "invalid credentials"}
}
