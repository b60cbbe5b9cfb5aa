package mirror

import (
	"testing"

	"github.com/ferry-gw/ferry/routing"
)

// The routing state's topic is never mirrored, even by a pattern that
// matches every topic: each cluster's copy is written by Ferry directly
// (routing.DefaultStoreTopic).
func TestMirrorNeverSelectsFerryTopics(t *testing.T) {
	c := defaultConfig()
	Topics([]string{".*"}, nil)(&c)
	for _, n := range []string{routing.DefaultStoreTopic, "__consumer_offsets"} {
		if c.mirrorTopic(n, false) {
			t.Errorf("%s selected for mirroring by .*", n)
		}
	}
	if !c.mirrorTopic("app", false) {
		t.Error("app not selected by .*")
	}
}
