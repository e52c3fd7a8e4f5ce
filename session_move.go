package gowarp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/gowarp/gowarp/internal/failover"
	"github.com/gowarp/gowarp/internal/mem"
)

// Sessions that move with their STag table to another node (C12 with
// C14): see SessionListener.Export and docs/failover.md.

// moveTo points the initiator's paths at addrs, the addresses a redirect
// gave: every connection still up is ended (it reaches the old node) and
// every path is dialed at its new address.
func (s *Session) moveTo(addrs []string, resolved bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil || len(addrs) == 0 || len(addrs) > 255 || slices.Equal(addrs, s.paths) {
		return false // another path's redirect came first
	}
	old := len(s.paths)
	s.paths = slices.Clone(addrs)
	if resolved {
		s.stats.Resolved++
	} else {
		s.stats.Redirects++
	}
	s.log.Info("gowarp session: the peer moved", "id", s.id, "to", addrs)
	for len(s.conns) < len(addrs) {
		s.conns = append(s.conns, nil)
	}
	for _, c := range s.conns {
		if c != nil && !c.dead {
			s.dead(c, "the session moved to another node")
		}
	}
	for p := old; p < len(addrs); p++ {
		s.redial(p)
	}
	return true
}

// resolve asks SessionConfig.Resolve where the peer is, if no connection
// of the session is up, and moves there; it reports whether it moved.
func (s *Session) resolve() bool {
	s.mu.Lock()
	up := s.anyUp()
	s.mu.Unlock()
	if up {
		return false
	}
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.HeartbeatTimeout)
	addrs, err := s.cfg.Resolve(ctx, s.id)
	cancel()
	if err != nil {
		s.log.Info("gowarp session: Resolve failed", "id", s.id, "err", err)
		return false
	}
	return s.moveTo(addrs, true)
}

// Paths returns the addresses the session dials, one per path: those
// DialSession was given, or those of the node the session moved to. A
// listener's session has none.
func (s *Session) Paths() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.paths)
}

// stopForMove ends a session of an export: its connections are closed,
// what they brought in is taken and delivered as far as the application's
// receives go, and the state the new node carries on from is returned.
// The session then fails here with ErrSessionMoved.
func (s *Session) stopForMove() (failover.SessionState, bool) {
	s.cancel()
	s.wg.Wait() // the session's goroutine: nothing else takes the CQ
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return failover.SessionState{}, false
	}
	for _, c := range s.byQP {
		if !c.dead {
			c.dead = true
			c.qp.Close() // every completion is in the CQ once it returns
		}
	}
	for {
		n := s.cq.Poll(s.wc[:])
		for i := range s.wc[:n] {
			s.handle(&s.wc[i])
		}
		if n < len(s.wc) {
			break
		}
	}
	s.deliver()
	// Messages accepted and not delivered (no receive was posted for
	// them) are not carried: they were never acknowledged, so the peer
	// sends them again to the new node.
	st := failover.SessionState{ID: s.id, Delivered: s.dlvd, Sent: s.nextSeq,
		PeerMax: uint32(s.peerMax), OwnMax: uint32(s.cfg.MaxMessage),
		PeerWindow: uint16(s.peerWindow), OwnWindow: uint16(s.cfg.Window)}
	s.failLocked(fmt.Errorf("%w: exported with its table", ErrSessionMoved))
	return st, true
}

// SessionExportStats says what SessionListener.Export moved and how long
// its steps took.
type SessionExportStats struct {
	Sessions int // sessions handed off
	// Drain is how long the export waited for this side's work to be
	// acknowledged by the peers, Stop how long stopping the sessions
	// took.
	Drain, Stop time.Duration
	Table       ExportStats // the table's export, after the sessions'
}

// Export hands the listener's sessions to another node together with
// their STag table (the listener's protection domain's): it writes to w
// the sessions' state and then the table (Table.Export's stream), which
// Table.ImportSessions reads on the other node, whose SessionImport.Listen
// then carries the sessions on. redirect are the new node's addresses,
// one per path: from the moment a session stops here, a connection
// rejoining it is rejected with them, and the peer's session dials them
// instead (Session.Paths). Keep this listener open until the peers have
// rejoined on the new node: a peer that comes here after it closed finds
// no one to send it on, unless its SessionConfig.Resolve tells it where
// to go. With no redirect the rejection says only that the session
// moved, and the peer asks its Resolve (a peer without one fails with
// ErrSessionLost).
//
// In order: PostSend on the sessions fails with ErrSessionMoved from the
// start; the export waits (until ctx is done) for the work this side
// posted to be acknowledged, so that nothing of this side's is in flight
// (if ctx ends first, the export fails and the sessions go on); then each
// session's connections are closed, what they brought is delivered to
// the receives the application posted, and the session ends here: its
// receives left complete with ErrSessionMoved. The peer's messages that
// found no receive are not carried: unacknowledged, the peer sends them
// again to the new node, where duplicates of what was delivered here are
// dropped. Then the table is frozen and written. A failure after the
// sessions stopped ends them: the peers redirected to the new node find
// nothing there and time out (ErrSessionTimeout), the others are refused
// (ErrSessionLost).
func (l *SessionListener) Export(ctx context.Context, w io.Writer, redirect []string) (SessionExportStats, error) {
	var st SessionExportStats
	if err := ctx.Err(); err != nil {
		return st, err // no session stopped, nothing written
	}
	rd, err := failover.AppendRedirect(nil, redirect)
	if err != nil {
		return st, fmt.Errorf("%w: session export: %w", ErrBadConfig, err)
	}
	l.mu.Lock()
	if l.exporting {
		l.mu.Unlock()
		return st, fmt.Errorf("%w: an export of the listener's sessions is under way", ErrBadConfig)
	}
	l.exporting = true
	var ss []*Session
	for _, s := range l.sessions {
		if s.Err() == nil {
			ss = append(ss, s)
		}
	}
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		l.exporting = false
		l.mu.Unlock()
	}()
	t0 := time.Now()
	setMoving := func(v bool) {
		for _, s := range ss {
			s.mu.Lock()
			s.moving = v
			s.mu.Unlock()
		}
	}
	setMoving(true)
	for {
		busy := false
		for _, s := range ss {
			s.mu.Lock()
			busy = busy || s.err == nil && s.head < s.tail
			s.mu.Unlock()
		}
		if !busy {
			break
		}
		select {
		case <-ctx.Done():
			setMoving(false)
			return st, fmt.Errorf("gowarp: session export: work of this side's not acknowledged: %w", ctx.Err())
		case <-time.After(time.Millisecond):
		}
	}
	t1 := time.Now()
	st.Drain = t1.Sub(t0)
	var h failover.Handoff
	for _, s := range ss {
		l.mu.Lock()
		l.moved[s.id] = rd // a rejoin from now on is sent on
		l.mu.Unlock()
		if state, ok := s.stopForMove(); ok {
			h.Sessions = append(h.Sessions, state)
		}
		s.Close() // its own buffers leave the table before the freeze
	}
	st.Stop, st.Sessions = time.Since(t1), len(h.Sessions)
	fail := func(err error) (SessionExportStats, error) {
		l.mu.Lock()
		for _, s := range ss {
			delete(l.moved, s.id)
		}
		l.mu.Unlock()
		return st, err
	}
	tbl := l.pd.tbl
	froze := false
	switch err := tbl.t.Freeze(ctx); {
	case err == nil:
		froze = true
	case !errors.Is(err, mem.ErrFrozen):
		return fail(err)
	}
	if stag, ok := tbl.t.PDRegion(l.pd.id); ok {
		h.Anchor = uint32(stag)
	}
	if _, err := w.Write(h.Append(nil)); err != nil {
		if froze {
			tbl.Thaw()
		}
		return fail(fmt.Errorf("gowarp: session export: %w", err))
	}
	if st.Table, err = tbl.Export(ctx, w); err != nil {
		if froze {
			tbl.Thaw()
		}
		return fail(err)
	}
	return st, nil
}

// SessionImport is what Table.ImportSessions read: the table's regions
// and the sessions waiting to be carried on by Listen.
type SessionImport struct {
	*Imported
	h        failover.Handoff
	pd       *PD
	listened bool
}

// ImportSessions reads a stream that SessionListener.Export wrote: the
// sessions' state, then the table, which it imports into t as Import
// does. Nothing of the sessions runs until Listen.
func (t *Table) ImportSessions(ctx context.Context, r io.Reader, o ImportOptions) (*SessionImport, error) {
	if err := ctx.Err(); err != nil {
		return nil, err // nothing read
	}
	b := make([]byte, failover.HandoffPrefixLen)
	if _, err := io.ReadFull(r, b); err != nil {
		return nil, fmt.Errorf("%w: session hand-off: %w", ErrBadExport, err)
	}
	n, err := failover.HandoffLen(b)
	if err != nil {
		return nil, fmt.Errorf("%w: session hand-off: %w", ErrBadExport, err)
	}
	b = append(b, make([]byte, n-len(b))...)
	if _, err := io.ReadFull(r, b[failover.HandoffPrefixLen:]); err != nil {
		return nil, fmt.Errorf("%w: session hand-off: %w", ErrBadExport, err)
	}
	h, _, err := failover.ParseHandoff(b)
	if err != nil {
		return nil, fmt.Errorf("%w: session hand-off: %w", ErrBadExport, err)
	}
	imp, err := t.Import(ctx, r, o)
	if err != nil {
		return nil, err
	}
	si := &SessionImport{Imported: imp, h: h}
	if h.Anchor != 0 {
		si.pd = imp.PD(STag(h.Anchor))
	}
	if si.pd == nil {
		si.pd = t.AllocPD()
	}
	return si, nil
}

// Sessions returns the ids of the sessions imported.
func (si *SessionImport) Sessions() []uint64 {
	ids := make([]uint64, len(si.h.Sessions))
	for i, s := range si.h.Sessions {
		ids[i] = s.ID
	}
	return ids
}

// SessionPD returns the protection domain the exporting listener's
// sessions worked in, as imported (a new one if it had no region): the
// sessions carry on in it, so the peers' STags of its regions stay valid.
func (si *SessionImport) SessionPD() *PD { return si.pd }

// Listen carries the imported sessions on: it makes a session listener
// on lns (as PD.ListenSession, in SessionPD) that knows them, so their
// peers' rejoining connections join them. Each session picks up where it
// stopped on the old node: the peer's messages delivered there are
// dropped as duplicates when the peer sends them again, the rest are
// delivered here in order, and this side's sequence goes on from the
// old node's. Accept returns each imported session once, then the new
// ones. Window and MaxMessage are raised, for an imported session, to
// what the old node told its peer. Listen may be called once.
func (si *SessionImport) Listen(cfg SessionConfig, lns ...*Listener) (*SessionListener, error) {
	if si.listened {
		return nil, fmt.Errorf("%w: the imported sessions are listened for already", ErrBadConfig)
	}
	si.listened = true
	l := si.pd.newSessionListener(cfg, 16+len(si.h.Sessions))
	var made []*Session
	for _, st := range si.h.Sessions {
		c := l.cfg
		c.Window, c.MaxMessage = max(c.Window, int(st.OwnWindow)), max(c.MaxMessage, int(st.OwnMax))
		s, err := newSession(si.pd, c, st.ID, false)
		if err != nil {
			for _, m := range made {
				m.Close()
			}
			return nil, err
		}
		s.peerWindow, s.peerMax = uint64(st.PeerWindow), int(st.PeerMax)
		s.rcvd, s.dlvd = st.Delivered, st.Delivered
		s.nextSeq, s.peerAck = st.Sent, st.Sent
		l.adopt(s)
		made = append(made, s)
	}
	for _, s := range made {
		s.start()
		l.accepted <- s
	}
	l.serve(lns)
	return l, nil
}
