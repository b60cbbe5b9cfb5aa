//go:build !faults

package proxy

import "github.com/twmb/franz-go/pkg/kmsg"

// faultRefusedCommit is never true in a member not built for fault
// injection (see faults.go).
func faultRefusedCommit(*request, kmsg.Request) bool { return false }
