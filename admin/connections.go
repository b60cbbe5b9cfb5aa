package admin

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"go.uber.org/zap"

	"github.com/ferry-gw/ferry/proxy"
)

// ConnzFunc reports the member's client connections (proxy.Server.Connz).
type ConnzFunc func(proxy.ConnzOptions) (*proxy.Connz, error)

// WithConnections enables GET /connections, answered by f. Without it the
// endpoint does not exist (404).
func WithConnections(f ConnzFunc) Option { return func(c *config) { c.connz = f } }

// Connections returns the member's client connections as o selects them;
// an error wrapping proxy.ErrConnzOptions is the caller's mistake.
func (s *Server) Connections(o proxy.ConnzOptions) (*proxy.Connz, error) {
	if s.cfg.connz == nil {
		return nil, errors.New("connections are not reported by this member")
	}
	return s.cfg.connz(o)
}

// HandleConnections answers Connections as indented JSON. The query
// selects: state (open, closed, all), sort, offset, limit, and the filters
// client_id, software, remote and principal (substrings). A bad value answers 400.
func (s *Server) HandleConnections(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	o := proxy.ConnzOptions{State: q.Get("state"), Sort: q.Get("sort"), ClientID: q.Get("client_id"), Software: q.Get("software"), Remote: q.Get("remote"), Principal: q.Get("principal")}
	var err error
	for _, p := range []struct {
		name string
		to   *int
	}{{"offset", &o.Offset}, {"limit", &o.Limit}} {
		if v := q.Get(p.name); v != "" && err == nil {
			if *p.to, err = strconv.Atoi(v); err != nil {
				err = fmt.Errorf("%w: %s %q is not a number", proxy.ErrConnzOptions, p.name, v)
			}
		}
	}
	var cz *proxy.Connz
	if err == nil {
		cz, err = s.Connections(o)
	}
	if err != nil {
		code := http.StatusInternalServerError
		if errors.Is(err, proxy.ErrConnzOptions) {
			code = http.StatusBadRequest
		}
		http.Error(w, err.Error(), code)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(cz); err != nil {
		s.cfg.log.Debug("writing /connections", zap.Error(err))
	}
}
