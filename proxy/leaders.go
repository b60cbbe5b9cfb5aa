package proxy

import (
	"context"
	"errors"

	"github.com/twmb/franz-go/pkg/kerr"
)

// errStop ends a batch walk early.
var errStop = errors.New("stop")

// tp names a partition.
type tp struct {
	topic string
	p     int32
}

// byLeader groups partitions by their upstream leader. Partitions Ferry
// cannot route are returned with the error a broker would give.
func (c *clientConn) byLeader(ctx context.Context, u *upstream, parts []tp) (map[int32][]tp, map[tp]int16) {
	out := map[int32][]tp{}
	var errs map[tp]int16
	for _, x := range parts {
		pinfo, ok := u.partition(ctx, x.topic, x.p)
		code := int16(0)
		switch {
		case !ok:
			code = kerr.UnknownTopicOrPartition.Code
		case pinfo.leader < 0:
			code = kerr.NotLeaderForPartition.Code
		}
		if code != 0 {
			if errs == nil {
				errs = map[tp]int16{}
			}
			errs[x] = code
			continue
		}
		out[pinfo.leader] = append(out[pinfo.leader], x)
	}
	return out, errs
}
