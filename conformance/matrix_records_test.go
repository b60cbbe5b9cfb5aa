package conformance

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
)

// Checks the matrix applies to what the client programs printed and to
// the cluster's state afterwards.

type position struct {
	partition int32
	offset    int64
}

func (r record) pos() position { return position{r.Partition, r.Offset} }

// checkProduced checks one produce run's output against the contract:
// count acknowledged records in order, record i with key k-i, value
// v-i-<run>, header h=i and timestamp first+i, at a valid partition.
func checkProduced(t *testing.T, recs []record, count int) {
	t.Helper()
	if len(recs) != count {
		t.Fatalf("produce acknowledged %d records, want %d", len(recs), count)
	}
	for i, r := range recs {
		var errs []string
		if want := fmt.Sprintf("k-%d", i); r.Key != want {
			errs = append(errs, "key, want "+want)
		}
		if !strings.HasPrefix(r.Value, fmt.Sprintf("v-%d-", i)) {
			errs = append(errs, fmt.Sprintf("value, want v-%d-<run>", i))
		}
		if want := map[string]string{"h": fmt.Sprint(i)}; !maps.Equal(r.Headers, want) {
			errs = append(errs, fmt.Sprintf("headers, want %v", want))
		}
		if want := recs[0].Timestamp + int64(i); r.Timestamp != want {
			errs = append(errs, fmt.Sprintf("timestamp, want %d", want))
		}
		if r.Partition < 0 || r.Partition >= partitions || r.Offset < 0 {
			errs = append(errs, "partition or offset out of range")
		}
		if len(errs) > 0 {
			t.Fatalf("produced record %d (%v): bad %s", i, r, strings.Join(errs, "; "))
		}
	}
}

// checkDistinctOffsets checks that no two acknowledged records claim the
// same partition and offset.
func checkDistinctOffsets(t *testing.T, recs []record) {
	t.Helper()
	seen := make(map[position]record, len(recs))
	for _, r := range recs {
		if prev, dup := seen[r.pos()]; dup {
			t.Fatalf("two acknowledged records at partition %d offset %d: %v and %v", r.Partition, r.Offset, prev, r)
		}
		seen[r.pos()] = r
	}
}

// checkConsumed checks that got holds exactly the records of want, equal in
// partition, offset, key, value, headers and timestamp, each partition read
// in offset order.
func checkConsumed(t *testing.T, got, want []record) {
	t.Helper()
	last := map[int32]int64{}
	for _, r := range got {
		if prev, ok := last[r.Partition]; ok && r.Offset <= prev {
			t.Errorf("partition %d read out of order: offset %d after %d", r.Partition, r.Offset, prev)
		}
		last[r.Partition] = r.Offset
	}
	wantAt := make(map[position]record, len(want))
	for _, r := range want {
		wantAt[r.pos()] = r
	}
	gotAt := make(map[position]record, len(got))
	var problems []string
	for _, r := range got {
		if _, dup := gotAt[r.pos()]; dup {
			problems = append(problems, fmt.Sprintf("read twice: %v", r))
			continue
		}
		gotAt[r.pos()] = r
		w, ok := wantAt[r.pos()]
		switch {
		case !ok:
			problems = append(problems, fmt.Sprintf("unexpected: %v", r))
		case !sameRecord(r, w):
			problems = append(problems, fmt.Sprintf("differs: got %v, want %v", r, w))
		}
	}
	for _, w := range want {
		if _, ok := gotAt[w.pos()]; !ok {
			problems = append(problems, fmt.Sprintf("missing: %v", w))
		}
	}
	if len(problems) > 0 {
		shown := problems[:min(len(problems), 10)]
		t.Fatalf("consumed %d records, want %d; %d problems, first %d:\n%s",
			len(got), len(want), len(problems), len(shown), strings.Join(shown, "\n"))
	}
}

func sameRecord(a, b record) bool {
	return a.Partition == b.Partition && a.Offset == b.Offset && a.Key == b.Key && a.Value == b.Value &&
		maps.Equal(a.Headers, b.Headers) && a.Timestamp == b.Timestamp
}

// checkGroup checks, against the cluster, that group is of the type the
// group protocol makes ("classic" or "consumer") and has committed every
// partition of topic at its end offset, and that the committed offsets read
// through the target are the same. A partition that is empty may have no
// commit.
func checkGroup(t *testing.T, adm, via *kadm.Client, group, protocol, topic string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	groups, err := adm.ListGroups(ctx)
	if err != nil {
		t.Fatalf("listing groups: %v", err)
	}
	if g, ok := groups[group]; !ok {
		t.Errorf("group %s not listed by the cluster", group)
	} else if g.GroupType != protocol {
		t.Errorf("group %s is of type %q, want %q (the --group-protocol used)", group, g.GroupType, protocol)
	}
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		t.Fatalf("listing end offsets of %s: %v", topic, err)
	}
	committed, err := adm.FetchOffsets(ctx, group)
	if err == nil {
		err = committed.Error()
	}
	if err != nil {
		t.Fatalf("fetching offsets of group %s: %v", group, err)
	}
	viaCommitted, err := via.FetchOffsets(ctx, group)
	if err == nil {
		err = viaCommitted.Error()
	}
	if err != nil {
		t.Fatalf("fetching offsets of group %s through the target: %v", group, err)
	}
	ends.Each(func(end kadm.ListedOffset) {
		c, ok := committed.Lookup(topic, end.Partition)
		if v, vok := viaCommitted.Lookup(topic, end.Partition); vok != ok || v.At != c.At {
			t.Errorf("group %s: %s[%d] committed at %d read directly, %d read through the target", group, topic, end.Partition, c.At, v.At)
		}
		switch {
		case !ok && end.Offset == 0:
		case !ok:
			t.Errorf("group %s: no committed offset for %s[%d], want end offset %d", group, topic, end.Partition, end.Offset)
		case c.At != end.Offset:
			t.Errorf("group %s: committed %s[%d] at %d, want end offset %d", group, topic, end.Partition, c.At, end.Offset)
		}
	})
}
