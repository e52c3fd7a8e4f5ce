package gowarp

import "strconv"

// Transport is the kind of link under a queue pair.
type Transport uint8

// Transports.
const (
	// TransportTCP: the MPA stream itself, a TCP connection (or the
	// stream ConnectConn was given). An unconnected queue pair reports it
	// too.
	TransportTCP Transport = iota
	// TransportSharedMemory: a same-host shared-memory link between two
	// gowarp peers (ConnectOptions.SharedMemory), the TCP connection
	// beside it kept for liveness.
	TransportSharedMemory
)

func (t Transport) String() string {
	switch t {
	case TransportTCP:
		return "tcp"
	case TransportSharedMemory:
		return "shm"
	}
	return "Transport(" + strconv.Itoa(int(t)) + ")"
}

// Transport returns the kind of link connection setup gave the queue
// pair: TransportSharedMemory when both sides took a shared-memory link,
// else TransportTCP.
func (qp *QP) Transport() Transport {
	if qp.q.SharedMemory() {
		return TransportSharedMemory
	}
	return TransportTCP
}
