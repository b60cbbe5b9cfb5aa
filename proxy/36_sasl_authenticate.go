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
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferry-gw/ferry/clientauth"
	"github.com/ferry-gw/ferry/protocol"
)

var saslAuthenticateVersions = protocol.VersionRange{Min: 0, Max: 2}

func handleSASLAuthenticate(s *Server, c *clientConn, req *request, kr kmsg.Request) (*reply, error) {
	in := kr.(*kmsg.SASLAuthenticateRequest)
	resp := kmsg.NewPtrSASLAuthenticateResponse()
	mech := c.auth.mechanism
	fail := func(f *clientauth.Failure) (*reply, error) {
		s.authFailed(c, mech, f)
		resp.ErrorCode = kerr.SaslAuthenticationFailed.Code
		msg := fmt.Sprintf("Authentication failed during authentication due to %s with SASL mechanism %s", f.Msg, mech)
		if f.Reason == "rate_limited" {
			msg = f.Msg
		}
		resp.ErrorMessage = &msg
		delay := s.auth.Config().FailedDelay
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
		s.authMetrics.Failed(mech, "illegal_state")
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
		// anything is checked (clientauth.Authenticator.AdmitAddr), and each later round
		// goes on under the tokens it holds.
		adm, f := s.auth.AdmitAddr(c.ctx, c.ip)
		if f != nil {
			return fail(f)
		}
		c.auth.admission = adm
	}
	var out []byte
	done, principal := false, ""
	switch mech {
	case clientauth.MechanismPlain:
		user, password, f := clientauth.ParsePlain(in.SASLAuthBytes)
		if f == nil {
			f = s.auth.AdmitUser(c.ctx, c.auth.admission, user)
		}
		if f == nil {
			f = s.auth.Plain(user, password)
		}
		if f != nil {
			return fail(f)
		}
		done, principal = true, user
	case clientauth.MechanismSCRAMSHA256, clientauth.MechanismSCRAMSHA512:
		if first {
			c.auth.scram = s.auth.SCRAM(mech)
		}
		var err error
		if out, done, err = c.auth.scram.Next(in.SASLAuthBytes); err != nil {
			var f *clientauth.Failure
			if !errors.As(err, &f) {
				f = &clientauth.Failure{Reason: "malformed", Msg: err.Error()}
			}
			return fail(f)
		}
		if first {
			// The user is known from client-first: its token is taken
			// before the server-first that lets the client send a proof.
			if f := s.auth.AdmitUser(c.ctx, c.auth.admission, c.auth.scram.User()); f != nil {
				return fail(f)
			}
		}
		principal = c.auth.scram.User()
	case clientauth.MechanismOAuthBearer:
		// A token is not guessed like a password: the address's bucket
		// alone bounds the work.
		p, f := s.auth.OAuthBearer(in.SASLAuthBytes)
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
