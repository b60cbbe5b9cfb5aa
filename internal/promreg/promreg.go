// Package promreg registers Prometheus collectors that several servers in
// one process share.
package promreg

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// Shared registers c on reg (nil: none). When an equal collector is
// registered already — several servers on one registry — that one is
// returned instead, so that they count together.
func Shared[T prometheus.Collector](reg prometheus.Registerer, c T) (T, error) {
	if reg == nil {
		return c, nil
	}
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if !errors.As(err, &are) {
			return c, err
		}
		existing, ok := are.ExistingCollector.(T)
		if !ok {
			return c, err
		}
		return existing, nil
	}
	return c, nil
}
