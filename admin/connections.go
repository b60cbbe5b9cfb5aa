package admin

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"

	"github.com/ferry-gw/ferry/connstats"
	"go.uber.org/zap"
)

// ConnzFunc reports the member's client connections (proxy.Server.Connz).
type ConnzFunc func(connstats.Query) (*connstats.Report, error)

// WithConnections enables GET /connections, answered by f. Without it the
// endpoint does not exist (404).
func WithConnections(f ConnzFunc) Option { return func(c *config) { c.connz = f } }

// WithPublicRead shows the principals, client addresses and close errors
// of GET /connections to requests without the token too. Without it, and
// with a token configured, they are personal data shown only with the
// token (or a verified client certificate).
func WithPublicRead(on bool) Option { return func(c *config) { c.publicRead = on } }

// RedactedFields are the fields of each connection GET /connections empties
// for a request without the token: who the client is (principal), where it
// connects from (remote), and the error that closed it, which can name a
// user.
var RedactedFields = []string{"remote", "principal", "close_error"}

// ConnectionsAnswer is what GET /connections answers: the connections and,
// when some fields were emptied for want of the token, which.
type ConnectionsAnswer struct {
	connstats.Report
	Redacted []string `json:"redacted,omitempty"`
}

// Connections returns the member's client connections as o selects them;
// an error wrapping connstats.ErrQuery is the caller's mistake.
func (s *Server) Connections(o connstats.Query) (*connstats.Report, error) {
	if s.cfg.connz == nil {
		return nil, errors.New("connections are not reported by this member")
	}
	return s.cfg.connz(o)
}

// HandleConnections answers Connections as indented JSON. The query
// selects: state (open, closed, all), sort, offset, limit, and the filters
// client_id, software, remote and principal (substrings). A bad value
// answers 400. Without the token (and without WithPublicRead) the
// RedactedFields are emptied, and the remote and principal filters, which
// would tell them just as well, answer 401.
func (s *Server) HandleConnections(w http.ResponseWriter, r *http.Request) {
	cred, ok := s.authenticate(w, r)
	if !ok {
		return
	}
	redact := s.redacts(cred)
	q := r.URL.Query()
	o := connstats.Query{State: q.Get("state"), Sort: q.Get("sort"), ClientID: q.Get("client_id"), Software: q.Get("software"), Remote: q.Get("remote"), Principal: q.Get("principal")}
	if redact && (o.Remote != "" || o.Principal != "") {
		s.refuseToken(w, r, authNoToken, 0, "the remote and principal filters need the admin token: Authorization: Bearer <token>")
		return
	}
	var err error
	for _, p := range []struct {
		name string
		to   *int
	}{{"offset", &o.Offset}, {"limit", &o.Limit}} {
		if v := q.Get(p.name); v != "" && err == nil {
			if *p.to, err = strconv.Atoi(v); err != nil {
				err = fmt.Errorf("%w: %s %q is not a number", connstats.ErrQuery, p.name, v)
			}
		}
	}
	var cz *connstats.Report
	if err == nil {
		cz, err = s.Connections(o)
	}
	if err != nil {
		code := http.StatusInternalServerError
		if errors.Is(err, connstats.ErrQuery) {
			code = http.StatusBadRequest
		}
		http.Error(w, err.Error(), code)
		return
	}
	answer := ConnectionsAnswer{Report: *cz}
	if redact {
		answer.Redacted = RedactedFields
		answer.Connections = slices.Clone(answer.Connections) // not the caller's to change
		for i := range answer.Connections {
			c := &answer.Connections[i]
			c.Remote, c.Principal, c.CloseError = "", "", ""
		}
	}
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(answer); err != nil {
		s.cfg.log.Debug("writing /connections", zap.Error(err))
	}
}
