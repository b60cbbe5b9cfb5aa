package admin

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"time"

	"go.uber.org/zap"

	"github.com/ferry-gw/ferry/failover"
	"github.com/ferry-gw/ferry/routing"
)

// FailoverPauseFunc pauses automatic failover (p set) or resumes it (nil)
// for the whole fleet, durably (in the routing state), and returns the
// state in force; its errors are *routing.Error.
type FailoverPauseFunc func(ctx context.Context, p *routing.FailoverPause) (routing.State, error)

// WithFailoverPause enables POST /failover/pause and POST /failover/resume,
// which run f. Without it they do not exist (404).
func WithFailoverPause(f FailoverPauseFunc) Option { return func(c *config) { c.pauseFn = f } }

// FailoverPauseRequest is the body of POST /failover/pause (optional).
type FailoverPauseRequest struct {
	// Reason is for the people who read the status: why it is paused.
	Reason string `json:"reason,omitempty"`
}

// FailoverAnswer is the answer to a pause or a resume: whether automatic
// failover is paused now, and the routing state it is part of.
type FailoverAnswer struct {
	Paused  *routing.FailoverPause `json:"paused"`
	Routing RoutingStatus          `json:"routing"`
}

// Failover is automatic failover as this member sees it, or false when it
// is off here.
func (s *Server) Failover() (failover.Status, bool) {
	if s.cfg.failover == nil {
		return failover.Status{}, false
	}
	return s.cfg.failover(), true
}

// HandleFailover serves GET /failover: the failover section of /status.
func (s *Server) HandleFailover(w http.ResponseWriter, r *http.Request) {
	st, ok := s.Failover()
	if !ok {
		writeJSON(w, http.StatusNotFound, ErrorBody{Error: "failover_off", Message: "automatic failover is not configured on this member (failover.automatic)"})
		return
	}
	writeJSON(w, http.StatusOK, st)
}

// HandleFailoverPause serves POST /failover/pause and /failover/resume.
func (s *Server) HandleFailoverPause(pause bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var p *routing.FailoverPause
		if pause {
			var req FailoverPauseRequest
			body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxSwitchBody))
			if err == nil && len(body) > 0 {
				err = json.Unmarshal(body, &req)
			}
			if err != nil {
				writeJSON(w, http.StatusBadRequest, ErrorBody{Error: routing.ReasonBadRequest, Message: "the body must be {\"reason\": \"...\"} or empty: " + err.Error()})
				return
			}
			p = &routing.FailoverPause{At: s.cfg.now().UTC(), Reason: req.Reason}
		}
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 45*time.Second)
		defer cancel()
		what := "resume"
		if pause {
			what = "pause"
		}
		log := s.cfg.log.With(zap.String("remote", r.RemoteAddr))
		st, err := s.cfg.pauseFn(ctx, p)
		if err != nil {
			log.Warn("automatic failover "+what+" refused", zap.Error(err))
			var re *routing.Error
			if !errors.As(err, &re) {
				writeJSON(w, http.StatusInternalServerError, ErrorBody{Error: ReasonInternal, Message: err.Error()})
				return
			}
			writeJSON(w, switchStatus(re.Reason), ErrorBody{Error: re.Reason, Message: re.Msg, Switch: re.Switch})
			return
		}
		log.Info("automatic failover "+what+"d", zap.Stringer("routing", st))
		writeJSON(w, http.StatusOK, FailoverAnswer{Paused: st.FailoverPaused, Routing: routingStatus(st)})
	}
}
