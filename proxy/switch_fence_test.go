package proxy

import (
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferry-gw/ferry/routing"
)

// The transactional IDs clients name are remembered within a bound: a
// client naming ever new ones does not grow the member's memory, and the
// IDs named last are still known as carried.
func TestCarriedTxnsBounded(t *testing.T) {
	var c carriedTxns
	now := time.Unix(1_000_000, 0)
	const n = maxCarried + maxCarried/2
	for i := range n {
		c.note("txn-"+strconv.Itoa(i), now.Add(time.Duration(i)*time.Millisecond))
	}
	end := now.Add(n * time.Millisecond)
	if got := c.m.Len(); got > maxCarried {
		t.Fatalf("%d transactional IDs remembered, bound %d", got, maxCarried)
	}
	if c.carries("txn-0", end) {
		t.Fatalf("txn-0, the least recently named of %d, is still carried", n)
	}
	for i := n - 100; i < n; i++ {
		if !c.carries("txn-"+strconv.Itoa(i), end) {
			t.Fatalf("txn-%d, named among the last, is not carried", i)
		}
	}
	if c.carries("txn-"+strconv.Itoa(n-1), end.Add(carriedFor)) {
		t.Fatalf("an ID last named %v ago is still carried", carriedFor)
	}
}

// The fences a switch's drain announces are remembered within the same
// bound, the latest kept, and an init by another producer forgets one.
func TestSwitchFencesBounded(t *testing.T) {
	var f switchFences
	const n = maxCarried + maxCarried/2
	fs := make([]SwitchFence, n)
	for i := range fs {
		fs[i] = SwitchFence{TxnID: "txn-" + strconv.Itoa(i), ProducerID: int64(i), Epoch: 3}
	}
	f.add(7, fs)
	if got := f.n.Load(); got != maxCarried {
		t.Fatalf("%d fences remembered, want the bound %d", got, maxCarried)
	}
	if f.fenced(7, "txn-0", 0, 3) {
		t.Fatal("txn-0, the oldest fence, is still remembered past the bound")
	}
	last := "txn-" + strconv.Itoa(n-1)
	if !f.fenced(7, last, n-1, 3) {
		t.Fatalf("%s, fenced last, is not fenced", last)
	}
	for _, miss := range []struct {
		gen   uint32
		pid   int64
		epoch int16
	}{{8, n - 1, 3}, {7, n - 2, 3}, {7, n - 1, 4}} {
		if f.fenced(miss.gen, last, miss.pid, miss.epoch) {
			t.Fatalf("%s fenced under generation %d, producer ID %d, epoch %d", last, miss.gen, miss.pid, miss.epoch)
		}
	}
	f.forget(last)
	if f.fenced(7, last, n-1, 3) || f.n.Load() != maxCarried-1 {
		t.Fatalf("%s still fenced after forget (%d fences)", last, f.n.Load())
	}
}

// A transactional produce of the producer ID and epoch a switch's drain
// fenced, under the same generation, is answered UNKNOWN_PRODUCER_ID and
// not sent; another epoch of it, or another transactional ID with the same
// producer ID and epoch, is sent.
func TestSwitchFencedProduce(t *testing.T) {
	s, addr, up := idFixture(t)
	const phys, epoch = 4242, 3
	virt := routing.VirtualPID(idGen, phys)
	if got := s.SwitchFencing([]SwitchFence{{TxnID: "fenced", ProducerID: phys, Epoch: epoch}}); len(got) != 0 {
		t.Fatalf("SwitchFencing answered %v carried; want none named yet", got)
	}
	conn := dialRaw(t, addr)
	corr := int32(0)
	produce := func(txn string, ep int16) int16 {
		corr++
		resp := rawCall(t, conn, produceReq(s, t, &txn, recordBatch(virt, ep, 0, true)), corr).(*kmsg.ProduceResponse)
		return resp.Topics[0].Partitions[0].ErrorCode
	}
	if code := produce("fenced", epoch); code != kerr.UnknownProducerID.Code {
		t.Fatalf("the fenced producer's produce answered %v, want UNKNOWN_PRODUCER_ID", kerr.ErrorForCode(code))
	}
	if n := len(up.of(kmsg.Produce)); n != 0 {
		t.Fatalf("%d produces reached the cluster; want the fenced one answered by Ferry", n)
	}
	if n := refusals(s, "Produce", reasonSwitchFenced); n != 1 {
		t.Fatalf("ferry_refusals_total{api=Produce,reason=switch_fenced} = %v, want 1", n)
	}
	if got := s.SwitchFencing([]SwitchFence{{TxnID: "fenced", ProducerID: phys, Epoch: epoch}}); len(got) != 1 || got[0] != "fenced" {
		t.Fatalf("SwitchFencing answered %v carried; want [fenced], named by its produce", got)
	}
	produce("fenced", epoch+1)
	produce("other", epoch)
	if n := len(up.of(kmsg.Produce)); n != 2 {
		t.Fatalf("%d produces reached the cluster; want another epoch's and another transactional ID's", n)
	}
	if n := refusals(s, "Produce", reasonSwitchFenced); n != 1 {
		t.Fatalf("ferry_refusals_total{api=Produce,reason=switch_fenced} = %v after unfenced produces, want 1", n)
	}
}
