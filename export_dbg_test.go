package gowarp

import "fmt"

func DebugSession(s *Session) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return fmt.Sprintf("head %d posted %d tail %d nextSeq %d peerAck %d rcvd %d dlvd %d recvs %d-%d comp %d-%d pw %d tx %v ackTo %v err %v",
		s.head, s.posted, s.tail, s.nextSeq, s.peerAck, s.rcvd, s.dlvd, s.rHead, s.rTail, s.cHead, s.cTail, s.peerWindow, s.tx != nil, s.ackTo != nil, s.err)
}

// StallSession stops the goroutine of s before it takes its next event,
// and returns once it has stopped; the returned func lets it go on.
func StallSession(s *Session) (release func()) {
	gate, parked := make(chan struct{}), make(chan struct{}, 1)
	h := func(x *Session) {
		if x == s {
			select {
			case parked <- struct{}{}:
			default:
			}
			<-gate
		}
	}
	runHook.Store(&h)
	<-parked
	return func() {
		runHook.Store(nil)
		close(gate)
	}
}

// CloseSessionPath closes the queue pair of the session's path p, as a
// dead link would end it.
func CloseSessionPath(s *Session, p int) {
	s.mu.Lock()
	qp := s.conns[p].qp
	s.mu.Unlock()
	qp.Close()
}

// SessionReceived returns how many of the peer's messages s has taken in
// (delivered or waiting for a receive).
func SessionReceived(s *Session) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rcvd
}

// SessionCompletionsWaiting returns how many completions wait in the
// session's CQ, not yet taken by its goroutine.
func SessionCompletionsWaiting(s *Session) int { return s.cq.cq.Len() }

// SessionPathsDown reports whether every connection of s has left the
// ready state (its peer closed it, say), whether or not s has seen it.
func SessionPathsDown(s *Session) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.conns {
		if c != nil && c.qp.State() == StateReady {
			return false
		}
	}
	return true
}

// SessionBeats returns how many heartbeats s has run.
func SessionBeats(s *Session) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.beats
}

// SessionProbes returns the heartbeat probes s has tried on each path's
// current connection.
func SessionProbes(s *Session) []uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := make([]uint64, len(s.conns))
	for i, c := range s.conns {
		if c != nil {
			n[i] = c.pingSeq
		}
	}
	return n
}

// SessionNextLook returns when the goroutine of s would next look at its
// connections, were it to go to sleep now: bounds lo and hi on the
// session clock (ns since its epoch), and the heartbeat interval.
func SessionNextLook(s *Session) (lo, hi int64, iv int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t0 := now()
	d := s.nextBeat()
	t1 := now()
	return t0 + int64(d), t1 + int64(d), int64(s.cfg.HeartbeatInterval)
}

// SessionTakenIn returns how many messages s has taken in from its peer
// and how many of them it has delivered.
func SessionTakenIn(s *Session) (rcvd, dlvd uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rcvd, s.dlvd
}
