//go:build !linux

package splice

import (
	"errors"
	"syscall"
)

const Size = 0

var errUnsupported = errors.New("splice: not supported on this system")

// Pipe is a kernel pipe; there is none on this system.
type Pipe struct{}

// Get fails here: the caller copies.
func Get() (*Pipe, error)                            { return nil, errUnsupported }
func Put(*Pipe)                                      {}
func (*Pipe) Cap() int                               { return 0 }
func (*Pipe) Held() int                              { return 0 }
func (*Pipe) Close()                                 {}
func (*Pipe) From(syscall.RawConn, int) (int, error) { return 0, errUnsupported }
func (*Pipe) To(syscall.RawConn, int) (int, error)   { return 0, errUnsupported }
func (*Pipe) ReadFull([]byte) error                  { return errUnsupported }
