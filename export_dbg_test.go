package gowarp

import "fmt"

func DebugSession(s *Session) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return fmt.Sprintf("head %d posted %d tail %d nextSeq %d peerAck %d rcvd %d dlvd %d recvs %d-%d comp %d-%d pw %d tx %v ackTo %v err %v",
		s.head, s.posted, s.tail, s.nextSeq, s.peerAck, s.rcvd, s.dlvd, s.rHead, s.rTail, s.cHead, s.cTail, s.peerWindow, s.tx != nil, s.ackTo != nil, s.err)
}
