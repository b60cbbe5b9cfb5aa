package proxy

import (
	"testing"

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
	}
}
