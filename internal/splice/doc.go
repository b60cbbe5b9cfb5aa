// Package splice moves bytes between TCP sockets through a kernel pipe
// (splice(2)) so that they never enter the process: a Produce's record
// batches go from the client's socket into a pipe while the request's
// small fields are read and checked, and from the pipe to the broker's
// socket once the request is let through.
//
// A pipe holds what was moved into it until it is moved out or read back
// (ReadFull); one that still holds bytes nobody will take is closed, not
// pooled. Where splice(2) is not available (another OS) Get fails and the
// caller copies as before.
package splice
