package connstats

import (
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/ferry-gw/ferry/protocol"
	"github.com/ferry-gw/ferry/protocol/kfields"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Per-connection accounting, read by the connections report (report.go)
// and the per-client metrics (clientmetrics.go).
//
// The request path only does atomic adds on the connection's own struct:
// no locks, no maps. Requests are counted in a fixed array indexed by API
// key, error codes in one indexed by code (allocated at the first error,
// since most connections never see one), latencies in a small ring.

// latencyWindow is how many of a connection's latest answers its p50 and
// p99 are computed over.
const latencyWindow = 128

// errCodeSlots holds the error codes -1 up to errCodeSlots-3 (kerr knows up
// to 136); the last slot counts any other code.
const errCodeSlots = 160

// unknownKeySlot is the requests slot of a key outside kmsg's range.
const unknownKeySlot = kmsg.MaxKey + 1

// Stats are one connection's counters.
type Stats struct {
	// The reader goroutine adds these; the writer the rest, past a cache
	// line of padding so that the two do not contend for one.
	bytesIn  atomic.Uint64
	requests [kmsg.MaxKey + 2]atomic.Uint64
	_        [64]byte

	bytesOut atomic.Uint64
	// errors counts responses with a non-zero error code, and requests
	// refused by closing the connection; codes counts the former by
	// code.
	errors atomic.Uint64
	codes  atomic.Pointer[[errCodeSlots]atomic.Uint64]
	// latency is a ring of the latest answers' durations in microseconds;
	// answered counts every answer (its next slot is answered %
	// latencyWindow). Only the writer goroutine adds.
	answered atomic.Uint64
	latency  [latencyWindow]atomic.Uint32
}

// Request counts one request read, of n bytes with its size.
func (st *Stats) Request(key int16, n int) {
	st.bytesIn.Add(uint64(n))
	if key < 0 || key > kmsg.MaxKey {
		key = unknownKeySlot
	}
	st.requests[key].Add(1)
}

// Answer records one answer written, of n bytes, d after its request was
// read.
func (st *Stats) Answer(n int64, d time.Duration) {
	st.bytesOut.Add(uint64(n))
	us := d.Microseconds()
	if us > int64(^uint32(0)) {
		us = int64(^uint32(0))
	}
	i := st.answered.Add(1) - 1
	st.latency[i%latencyWindow].Store(uint32(max(us, 0)))
}

// CountResponse counts the error codes of a response Ferry encodes: once
// per response for each distinct non-zero code, top-level or partition.
// Only responses Ferry has decoded or built pass here; bytes passed through
// are not decoded to be counted.
func (st *Stats) CountResponse(resp kmsg.Response) { st.CountCodes(ResponseCodes(resp)) }

// ResponseCodes are the distinct error codes of resp, for a response
// answered many times (CountCodes) to be walked once.
func ResponseCodes(resp kmsg.Response) Codes {
	var seen Codes
	responseCodes(resp, seen.add)
	return seen
}

// CountCodes counts a response's codes (ResponseCodes) as CountResponse
// counts the response's.
func (st *Stats) CountCodes(seen Codes) {
	if seen.n == 0 {
		return
	}
	codes := st.codes.Load()
	if codes == nil {
		codes = new([errCodeSlots]atomic.Uint64)
		if !st.codes.CompareAndSwap(nil, codes) {
			codes = st.codes.Load()
		}
	}
	for _, c := range seen.codes[:seen.n] {
		i := int(c) + 1
		if i < 0 || i >= errCodeSlots-1 {
			i = errCodeSlots - 1
		}
		codes[i].Add(1)
	}
	st.errors.Add(1)
}

// Latencies returns the p50 and p99 of the latest answers and how many
// there were (at most latencyWindow).
func (st *Stats) Latencies() (p50, p99 time.Duration, n int) {
	total := st.answered.Load()
	n = int(min(total, latencyWindow))
	if n == 0 {
		return 0, 0, 0
	}
	us := make([]uint32, n)
	for i := range us {
		us[i] = st.latency[i].Load()
	}
	slices.Sort(us)
	at := func(q float64) time.Duration {
		return time.Duration(us[min(int(q*float64(n)), n-1)]) * time.Microsecond
	}
	return at(0.50), at(0.99), n
}

// RequestsByAPI returns the non-zero request counts by API name, and their
// sum.
func (st *Stats) RequestsByAPI() (map[string]uint64, uint64) {
	out := map[string]uint64{}
	var total uint64
	for k := range st.requests {
		if n := st.requests[k].Load(); n > 0 {
			out[protocol.APIName(int16(k))] += n
			total += n
		}
	}
	return out, total
}

// ErrorsByCode returns the non-zero error counts by Kafka error name.
func (st *Stats) ErrorsByCode() map[string]uint64 {
	codes := st.codes.Load()
	if codes == nil {
		return nil
	}
	out := map[string]uint64{}
	for i := range codes {
		if n := codes[i].Load(); n > 0 {
			name := "OTHER"
			if i < errCodeSlots-1 {
				name = errorName(int16(i - 1))
			}
			out[name] += n
		}
	}
	return out
}

func errorName(code int16) string {
	if ke := kerr.TypedErrorForCode(code); ke != nil && ke.Code == code {
		return ke.Message
	}
	return "CODE_" + strconv.Itoa(int(code))
}

// Codes are the distinct codes of one response (up to 8: more are rare
// and dropped).
type Codes struct {
	codes [8]int16
	n     int
}

func (s *Codes) add(c int16) {
	if c == 0 {
		return
	}
	for _, have := range s.codes[:s.n] {
		if have == c {
			return
		}
	}
	if s.n < len(s.codes) {
		s.codes[s.n] = c
		s.n++
	}
}

// responseCodes calls f with the top-level and partition error codes of
// resp: by hand for the APIs clients use most, by the walk package kfields
// generates for the rest.
func responseCodes(resp kmsg.Response, f func(int16)) {
	switch r := resp.(type) {
	case *kmsg.ProduceResponse:
		for i := range r.Topics {
			for j := range r.Topics[i].Partitions {
				f(r.Topics[i].Partitions[j].ErrorCode)
			}
		}
	case *kmsg.FetchResponse:
		f(r.ErrorCode)
		for i := range r.Topics {
			for j := range r.Topics[i].Partitions {
				f(r.Topics[i].Partitions[j].ErrorCode)
			}
		}
	case *kmsg.ListOffsetsResponse:
		for i := range r.Topics {
			for j := range r.Topics[i].Partitions {
				f(r.Topics[i].Partitions[j].ErrorCode)
			}
		}
	case *kmsg.MetadataResponse:
		for i := range r.Topics {
			f(r.Topics[i].ErrorCode)
			for j := range r.Topics[i].Partitions {
				f(r.Topics[i].Partitions[j].ErrorCode)
			}
		}
	case *kmsg.OffsetForLeaderEpochResponse:
		for i := range r.Topics {
			for j := range r.Topics[i].Partitions {
				f(r.Topics[i].Partitions[j].ErrorCode)
			}
		}
	case *kmsg.FindCoordinatorResponse:
		f(r.ErrorCode)
		for i := range r.Coordinators {
			f(r.Coordinators[i].ErrorCode)
		}
	case *kmsg.ApiVersionsResponse:
		f(r.ErrorCode)
	case *kmsg.JoinGroupResponse:
		f(r.ErrorCode)
	case *kmsg.SyncGroupResponse:
		f(r.ErrorCode)
	case *kmsg.HeartbeatResponse:
		f(r.ErrorCode)
	case *kmsg.LeaveGroupResponse:
		f(r.ErrorCode)
	case *kmsg.InitProducerIDResponse:
		f(r.ErrorCode)
	case *kmsg.EndTxnResponse:
		f(r.ErrorCode)
	case *kmsg.DescribeClusterResponse:
		f(r.ErrorCode)
	case *kmsg.SASLHandshakeResponse:
		f(r.ErrorCode)
	case *kmsg.ListGroupsResponse:
		f(r.ErrorCode)
	default:
		kfields.ErrorCodes(resp, f)
	}
}

// Refused counts a request refused by closing the connection.
func (st *Stats) Refused() { st.errors.Add(1) }

// Bytes are the bytes of the requests read and the answers written, sizes
// included.
func (st *Stats) Bytes() (in, out uint64) { return st.bytesIn.Load(), st.bytesOut.Load() }

// ErrorsTotal counts the responses with a non-zero error code, and the
// requests refused by closing the connection.
func (st *Stats) ErrorsTotal() uint64 { return st.errors.Load() }
