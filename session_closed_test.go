package gowarp

import (
	"testing"
	"time"
)

// TestNoteClosed: a listener remembers the sessions its application
// closed for a minute and twice the deadline, and forgets them after,
// oldest first; one noted again is remembered from its last note.
func TestNoteClosed(t *testing.T) {
	l := Open().AllocPD().newSessionListener(SessionConfig{Deadline: time.Second}, 1)
	keep := time.Minute + 2*time.Second
	t0 := time.Now()
	for i := range 1000 {
		l.noteClosedAt(uint64(i), t0.Add(time.Duration(i)*time.Millisecond))
	}
	l.noteClosedAt(3, t0.Add(999*time.Millisecond)) // again, later
	l.noteClosedAt(5000, t0.Add(keep+500*time.Millisecond))
	// Expired: noted at or before t0+499 ms (strictly more than keep ago).
	for _, id := range []uint64{0, 1, 2, 4, 499} {
		if _, ok := l.closed[id]; ok {
			t.Errorf("session %d noted %v before is still remembered", id, keep+500*time.Millisecond-time.Duration(id)*time.Millisecond)
		}
	}
	for _, id := range []uint64{3, 500, 999, 5000} {
		if _, ok := l.closed[id]; !ok {
			t.Errorf("session %d forgotten too soon", id)
		}
	}
	if n := len(l.closed); n != 502 {
		t.Errorf("%d sessions remembered, want 502", n)
	}
	// Much later, all but the last go.
	l.noteClosedAt(6000, t0.Add(3*keep))
	if n := len(l.closed); n != 1 {
		t.Errorf("%d sessions remembered, want 1", n)
	}
	if n := len(l.closedOrder); n != 1 {
		t.Errorf("%d notes kept in order, want 1", n)
	}
}

// BenchmarkNoteClosed: noting a closed session costs the same however many
// closed in the last minute (100,000 here): before, each note walked them
// all.
func BenchmarkNoteClosed(b *testing.B) {
	l := Open().AllocPD().newSessionListener(SessionConfig{}, 1)
	t0 := time.Now()
	id := uint64(0)
	for ; id < 100000; id++ {
		l.noteClosedAt(id, t0)
	}
	for b.Loop() {
		id++
		l.noteClosedAt(id, t0.Add(time.Duration(id)*time.Microsecond)) // 1,000,000 closes a second
	}
}
