package clusterauth

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/twmb/franz-go/pkg/kbin"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// authenticate runs the SASL exchange on a fresh connection, the way
// franz-go does on its own (kgo's broker.go, sasl and doSasl):
// SaslHandshake v1 names the mechanism, then SaslAuthenticate v2 frames
// carry the mechanism's messages until its session is done. Kafka accepts
// SaslHandshake as the first request on a connection, so ApiVersions is
// not asked first.
func (sec *Security) authenticate(ctx context.Context, nc net.Conn, addr string) (Session, error) {
	fail := func(step string, err error) error {
		return &Error{Cluster: sec.cluster, Addr: addr, Step: step, Mech: sec.mech.Name(), User: sec.user, Err: err}
	}
	if dl, ok := ctx.Deadline(); ok {
		nc.SetDeadline(dl)
		defer nc.SetDeadline(time.Time{})
	}
	stop := context.AfterFunc(ctx, func() { nc.SetDeadline(time.Now().Add(-time.Second)) })
	defer stop()
	ex := exchanger{nc: nc, fmt: kmsg.NewRequestFormatter(kmsg.FormatterClientID("ferry"))}

	hs := kmsg.NewPtrSASLHandshakeRequest()
	hs.Version = 1
	hs.Mechanism = sec.mech.Name()
	resp, err := ex.do(hs)
	if err != nil {
		return Session{}, fail("SASL handshake", err)
	}
	hr := resp.(*kmsg.SASLHandshakeResponse)
	if err := kerr.ErrorForCode(hr.ErrorCode); err != nil {
		return Session{}, fail("SASL handshake", fmt.Errorf("%w (the brokers offer %v)", err, hr.SupportedMechanisms))
	}

	host, _, _ := net.SplitHostPort(addr)
	session, clientWrite, err := sec.mech.Authenticate(ctx, host)
	if err != nil {
		return Session{}, fail("reading the credentials", err)
	}
	if len(clientWrite) == 0 {
		return Session{}, fail("SASL authentication", errors.New("the mechanism wrote nothing first"))
	}
	var lifetime int64
	var sent time.Time
	for done := false; !done || len(clientWrite) > 0; {
		req := kmsg.NewPtrSASLAuthenticateRequest()
		req.Version = 2
		req.SASLAuthBytes = clientWrite
		sent = time.Now()
		resp, err := ex.do(req)
		if err != nil {
			return Session{}, fail("SASL authentication", err)
		}
		ar := resp.(*kmsg.SASLAuthenticateResponse)
		if err := kerr.ErrorForCode(ar.ErrorCode); err != nil {
			if ar.ErrorMessage != nil && *ar.ErrorMessage != "" {
				err = fmt.Errorf("%w: %s", err, *ar.ErrorMessage)
			}
			return Session{}, fail("SASL authentication", err)
		}
		lifetime = ar.SessionLifetimeMillis
		clientWrite = nil
		if !done {
			if done, clientWrite, err = session.Challenge(ar.SASLAuthBytes); err != nil {
				return Session{}, fail("SASL authentication", err)
			}
		}
	}
	if lifetime <= 0 {
		return Session{}, nil
	}
	lifetime = min(lifetime, 365*24*int64(time.Hour/time.Millisecond))
	l := time.Duration(lifetime) * time.Millisecond
	return Session{Lifetime: l, Expires: sent.Add(l)}, nil
}

// exchanger sends one request at a time on a connection nothing else
// reads yet, and reads its response.
type exchanger struct {
	nc   net.Conn
	fmt  *kmsg.RequestFormatter
	corr int32
}

// maxAuthResponse bounds a SASL response frame.
const maxAuthResponse = 1 << 20

func (e *exchanger) do(req kmsg.Request) (kmsg.Response, error) {
	e.corr++
	if _, err := e.nc.Write(e.fmt.AppendRequest(nil, req, e.corr)); err != nil {
		return nil, err
	}
	var size [4]byte
	if _, err := io.ReadFull(e.nc, size[:]); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("the broker closed the connection")
		}
		return nil, err
	}
	n := int32(binary.BigEndian.Uint32(size[:]))
	if n < 4 || n > maxAuthResponse {
		return nil, fmt.Errorf("response frame of %d bytes (is this listener SASL, with TLS as configured?)", n)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(e.nc, body); err != nil {
		return nil, err
	}
	r := kbin.Reader{Src: body}
	if got := r.Int32(); got != e.corr {
		return nil, fmt.Errorf("response correlation ID %d, want %d", got, e.corr)
	}
	resp := req.ResponseKind()
	resp.SetVersion(req.GetVersion())
	if resp.IsFlexible() {
		kmsg.SkipTags(&r)
	}
	if !r.Ok() {
		return nil, errors.New("response shorter than its header")
	}
	if err := resp.ReadFrom(r.Src); err != nil {
		return nil, fmt.Errorf("decoding %s response: %w", kmsg.NameForKey(req.Key()), err)
	}
	return resp, nil
}
