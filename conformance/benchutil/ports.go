package benchutil

import "net"

// FreePorts returns n distinct loopback TCP ports that were free a moment
// ago (all held open together while they are picked, so none repeats).
func FreePorts(n int) ([]int, error) {
	var ports []int
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer ln.Close()
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
