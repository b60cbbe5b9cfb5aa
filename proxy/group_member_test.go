package proxy

import (
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// After a switch a KIP-848 member's heartbeat (with its epoch) meets
// GROUP_ID_NOT_FOUND on the new cluster; the client gets UNKNOWN_MEMBER_ID,
// on which it rejoins, instead of an error it takes as fatal. Joining
// (epoch 0), leaving (-1, -2), generation 0 and other errors pass as the
// broker answered.
func TestMemberOfOtherCluster(t *testing.T) {
	for _, c := range []struct {
		gen   uint32
		epoch int32
		code  int16
		want  int16
	}{
		{1, 5, kerr.GroupIDNotFound.Code, kerr.UnknownMemberID.Code},
		{2, 1, kerr.GroupIDNotFound.Code, kerr.UnknownMemberID.Code},
		{0, 5, kerr.GroupIDNotFound.Code, kerr.GroupIDNotFound.Code},
		{1, 0, kerr.GroupIDNotFound.Code, kerr.GroupIDNotFound.Code},
		{1, -1, kerr.GroupIDNotFound.Code, kerr.GroupIDNotFound.Code},
		{1, -2, kerr.GroupIDNotFound.Code, kerr.GroupIDNotFound.Code},
		{1, 5, kerr.FencedMemberEpoch.Code, kerr.FencedMemberEpoch.Code},
		{1, 5, 0, 0},
	} {
		req := kmsg.NewPtrConsumerGroupHeartbeatRequest()
		req.MemberEpoch = c.epoch
		resp := kmsg.NewPtrConsumerGroupHeartbeatResponse()
		resp.ErrorCode = c.code
		memberOfOtherCluster(c.gen, req, resp)
		if resp.ErrorCode != c.want {
			t.Errorf("generation %d, member epoch %d, broker's code %d: answered %d, want %d", c.gen, c.epoch, c.code, resp.ErrorCode, c.want)
		}
		// A share group member (KIP-932) alike.
		shreq := kmsg.NewPtrShareGroupHeartbeatRequest()
		shreq.MemberEpoch = c.epoch
		shresp := kmsg.NewPtrShareGroupHeartbeatResponse()
		shresp.ErrorCode = c.code
		shareMemberOfOtherCluster(c.gen, shreq, shresp)
		if shresp.ErrorCode != c.want {
			t.Errorf("share group: generation %d, member epoch %d, broker's code %d: answered %d, want %d", c.gen, c.epoch, c.code, shresp.ErrorCode, c.want)
		}
		// A Kafka Streams member of a streams group (KIP-1071) alike,
		// but for a leave, which has left.
		want := c.want
		if c.gen > 0 && c.epoch < 0 && c.code == kerr.GroupIDNotFound.Code {
			want = 0
		}
		sreq := kmsg.NewPtrStreamsGroupHeartbeatRequest()
		sreq.MemberID, sreq.MemberEpoch = "m-1", c.epoch
		sresp := kmsg.NewPtrStreamsGroupHeartbeatResponse()
		sresp.ErrorCode = c.code
		streamsMemberOfOtherCluster(c.gen, sreq, sresp)
		if sresp.ErrorCode != want || (want == 0 && c.code != 0 && (sresp.MemberID != "m-1" || sresp.MemberEpoch != c.epoch)) {
			t.Errorf("streams group: generation %d, member epoch %d, broker's code %d: answered %d (member %q at %d), want %d", c.gen, c.epoch, c.code, sresp.ErrorCode, sresp.MemberID, sresp.MemberEpoch, want)
		}
	}
}

// Commits of members from before a switch are carried only under a
// generation after a switch, within staleCommitWindow of this member taking
// it, and only when the broker refused every partition as from an unknown
// member or generation.
func TestStaleCommitsCarriedOnlyWhenAndWhereMeant(t *testing.T) {
	s := &Server{}
	if s.carriesStaleCommits(1) {
		t.Error("carried before any generation was noted")
	}
	s.noteGeneration(0)
	if s.carriesStaleCommits(0) {
		t.Error("carried under generation 0, before any switch")
	}
	s.noteGeneration(1)
	if !s.carriesStaleCommits(1) {
		t.Error("not carried just after taking generation 1")
	}
	if s.carriesStaleCommits(2) {
		t.Error("carried for a generation this member has not taken")
	}
	s.noteGeneration(1) // the same generation again: its start stays
	s.genSince.Store(&genStart{gen: 1, at: time.Now().Add(-staleCommitWindow - time.Second)})
	s.noteGeneration(1)
	if s.carriesStaleCommits(1) {
		t.Error("carried past the window")
	}

	answer := func(codes ...int16) *kmsg.OffsetCommitResponse {
		r := kmsg.NewPtrOffsetCommitResponse()
		rt := kmsg.OffsetCommitResponseTopic{Topic: "t"}
		for i, c := range codes {
			rt.Partitions = append(rt.Partitions, kmsg.OffsetCommitResponseTopicPartition{Partition: int32(i), ErrorCode: c})
		}
		r.Topics = []kmsg.OffsetCommitResponseTopic{rt}
		return r
	}
	member := kmsg.NewPtrOffsetCommitRequest()
	member.MemberID, member.Generation = "m", 3
	outside := kmsg.NewPtrOffsetCommitRequest()
	outside.MemberID, outside.Generation = "", -1
	unknown, illegal := kerr.UnknownMemberID.Code, kerr.IllegalGeneration.Code
	for _, c := range []struct {
		req  *kmsg.OffsetCommitRequest
		resp *kmsg.OffsetCommitResponse
		want bool
	}{
		{member, answer(unknown, unknown), true},
		{member, answer(illegal, unknown), true},
		{member, answer(unknown, 0), false},
		{member, answer(unknown, kerr.TopicAuthorizationFailed.Code), false},
		{member, answer(kerr.StaleMemberEpoch.Code), false},
		{member, answer(), false},
		{outside, answer(unknown), false},
	} {
		if got := staleMemberCommit(c.req, c.resp); got != c.want {
			t.Errorf("member %q generation %d answered %+v: carried %v, want %v", c.req.MemberID, c.req.Generation, c.resp.Topics, got, c.want)
		}
	}
}

// A classic member's heartbeat refused as from an unknown member or
// generation is told a rebalance is under way; any other answer stands.
func TestStaleHeartbeatAnsweredRebalance(t *testing.T) {
	for _, c := range []struct {
		code, want int16
	}{
		{kerr.UnknownMemberID.Code, kerr.RebalanceInProgress.Code},
		{kerr.IllegalGeneration.Code, kerr.RebalanceInProgress.Code},
		{0, 0},
		{kerr.RebalanceInProgress.Code, kerr.RebalanceInProgress.Code},
		{kerr.FencedInstanceID.Code, kerr.FencedInstanceID.Code},
		{kerr.GroupAuthorizationFailed.Code, kerr.GroupAuthorizationFailed.Code},
	} {
		r := kmsg.NewPtrHeartbeatResponse()
		r.ErrorCode = c.code
		staleMemberHeartbeat(r)
		if r.ErrorCode != c.want {
			t.Errorf("broker's %v answered %v, want %v", kerr.ErrorForCode(c.code), kerr.ErrorForCode(r.ErrorCode), kerr.ErrorForCode(c.want))
		}
	}
}

// After a switch a member's TxnOffsetCommit to the new cluster's group,
// still an empty classic group there (a Kafka Streams member of a streams
// group, KIP-1071), meets GROUP_ID_NOT_FOUND; the client gets
// UNKNOWN_MEMBER_ID (abortable, a task migration for Streams). A commit
// without a member, generation 0 and other errors pass as answered.
func TestTxnCommitOfOtherCluster(t *testing.T) {
	for _, c := range []struct {
		gen       uint32
		member    string
		memberGen int32
		code      int16
		want      int16
	}{
		{1, "m-1", 3, kerr.GroupIDNotFound.Code, kerr.UnknownMemberID.Code},
		{2, "", 3, kerr.GroupIDNotFound.Code, kerr.UnknownMemberID.Code},
		{1, "", -1, kerr.GroupIDNotFound.Code, kerr.GroupIDNotFound.Code},
		{0, "m-1", 3, kerr.GroupIDNotFound.Code, kerr.GroupIDNotFound.Code},
		{1, "m-1", 3, kerr.IllegalGeneration.Code, kerr.IllegalGeneration.Code},
		{1, "m-1", 3, 0, 0},
	} {
		req := kmsg.NewPtrTxnOffsetCommitRequest()
		req.MemberID, req.Generation = c.member, c.memberGen
		resp := kmsg.NewPtrTxnOffsetCommitResponse()
		resp.Topics = []kmsg.TxnOffsetCommitResponseTopic{{Topic: "t", Partitions: []kmsg.TxnOffsetCommitResponseTopicPartition{{Partition: 0, ErrorCode: c.code}, {Partition: 1, ErrorCode: c.code}}}}
		txnCommitOfOtherCluster(c.gen, req, resp)
		for _, p := range resp.Topics[0].Partitions {
			if p.ErrorCode != c.want {
				t.Errorf("generation %d, member %q at %d, broker's code %d: answered %d, want %d", c.gen, c.member, c.memberGen, c.code, p.ErrorCode, c.want)
			}
		}
	}
}
