package mem

import (
	"errors"
	"testing"
	"time"
)

func register(t testing.TB, tb *Table, o Options) *Region {
	t.Helper()
	r, err := tb.Register(1, [][]byte{make([]byte, 16)}, RemoteWrite|RemoteRead, o)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestSTagsAreNotGuessable: a peer holding one STag cannot name its
// neighbours. Consecutive registrations get indexes far apart, spread over
// the whole 24-bit space, and keys that vary; none is index 0.
func TestSTagsAreNotGuessable(t *testing.T) {
	const n = 4000
	tb := NewTable()
	seen := make(map[uint32]bool)
	keys := make(map[uint8]int)
	near := 0 // consecutive registrations within 16 indexes of each other
	lo, hi := uint32(1<<24), uint32(0)
	var prev STag
	for i := range n {
		s := register(t, tb, Options{}).STag()
		idx := s.Index()
		if idx == 0 || seen[idx] {
			t.Fatalf("registration %d: index %#x is 0 or in use", i, idx)
		}
		seen[idx] = true
		keys[s.Key()]++
		lo, hi = min(lo, idx), max(hi, idx)
		if i > 0 {
			d := int64(idx) - int64(prev.Index())
			if d >= -16 && d <= 16 {
				near++
			}
		}
		prev = s
	}
	// Random indexes put two consecutive ones within 16 of each other
	// about once in 2^18 registrations; sequential ones always do.
	if near > 2 {
		t.Errorf("%d of %d consecutive registrations got indexes within 16 of each other", near, n-1)
	}
	if lo > 1<<20 || hi < 1<<24-1<<20 {
		t.Errorf("indexes span only [%#x, %#x]", lo, hi)
	}
	// 4000 random keys take nearly all 256 values, none much more often
	// than the 15.6 expected.
	if len(keys) < 240 {
		t.Errorf("%d distinct keys in %d registrations", len(keys), n)
	}
	for k, c := range keys {
		if c > 60 {
			t.Errorf("key %#02x drawn %d times of %d", k, c, n)
		}
	}
	if tb.Len() != n {
		t.Fatalf("table holds %d regions, want %d", tb.Len(), n)
	}
}

// TestCallerKeyIsKept: a key the caller asks for is the STag's key, zero
// included when KeyFixed says so.
func TestCallerKeyIsKept(t *testing.T) {
	tb := NewTable()
	zero := 0
	for range 100 {
		if k := register(t, tb, Options{Key: 0x5a}).STag().Key(); k != 0x5a {
			t.Fatalf("key %#x, asked for 0x5a", k)
		}
		if k := register(t, tb, Options{KeyFixed: true}).STag().Key(); k != 0 {
			t.Fatalf("key %#x, asked for 0", k)
		}
		if register(t, tb, Options{}).STag().Key() == 0 {
			zero++
		}
	}
	if zero > 10 {
		t.Errorf("%d of 100 random keys were 0", zero)
	}
}

// TestCallerIndex: a requested index is given with the requested key, a
// taken one or one wider than 24 bits is refused and changes nothing, and
// a deregistered region's index can be asked for again.
func TestCallerIndex(t *testing.T) {
	tb := NewTable()
	r := register(t, tb, Options{Index: 0x123456, Key: 7, KeyFixed: true})
	if r.STag() != 0x12345607 {
		t.Fatalf("STag %v, asked for 0x12345607", r.STag())
	}
	for _, idx := range []uint32{0x123456, 1 << 24} {
		if _, err := tb.Register(1, [][]byte{make([]byte, 8)}, RemoteRead, Options{Index: idx}); !errors.Is(err, ErrIndexInUse) {
			t.Fatalf("index %#x: %v, want ErrIndexInUse", idx, err)
		}
	}
	if len(tb.regions) != 1 {
		t.Fatalf("%d regions after refused registrations", len(tb.regions))
	}
	if err := tb.Deregister(r); err != nil {
		t.Fatal(err)
	}
	if r2 := register(t, tb, Options{Index: 0x123456, Key: 8, KeyFixed: true}); r2.STag() != 0x12345608 {
		t.Fatalf("STag %v after re-registration", r2.STag())
	}
}

// TestLookup: an STag finds its region only with its own key, and not
// after Deregister; lookups allocate nothing.
func TestLookup(t *testing.T) {
	tb := NewTable()
	var regions []*Region
	for range 100 {
		regions = append(regions, register(t, tb, Options{}))
	}
	for _, r := range regions {
		if got, why := tb.Lookup(r.STag()); got != r || why != OK {
			t.Fatalf("Lookup(%v) = %p, %v", r.STag(), got, why)
		}
		if _, why := tb.Lookup(r.STag() ^ 1); why != InvalidSTag {
			t.Fatalf("Lookup with a wrong key: %v", why)
		}
	}
	s := regions[7].STag()
	if a := testing.AllocsPerRun(1000, func() {
		r, _ := tb.LookupHold(s)
		r.Unhold()
	}); a != 0 {
		t.Errorf("LookupHold and Unhold allocate %v times", a)
	}
	if err := regions[7].Deregister(); err != nil {
		t.Fatal(err)
	}
	if _, why := tb.Lookup(s); why != InvalidSTag {
		t.Fatalf("Lookup after Deregister: %v", why)
	}
	if err := regions[7].Deregister(); !errors.Is(err, ErrNotInTable) {
		t.Fatalf("second Deregister: %v", err)
	}
}

// TestDeregisterPinsAndHolds: a pinned region refuses Deregister and stays
// valid; a held one is invalidated at once, and Deregister returns only
// after the hold ends; no pin or hold is granted once Deregister began.
func TestDeregisterPinsAndHolds(t *testing.T) {
	defer func(d time.Duration) { deregisterWait = d }(deregisterWait)
	deregisterWait = time.Minute // this test ends the hold itself
	tb := NewTable()
	r := register(t, tb, Options{})
	if !r.TryAcquire() {
		t.Fatal("TryAcquire of a registered region failed")
	}
	if err := r.Deregister(); !errors.Is(err, ErrBusy) || !r.Valid() {
		t.Fatalf("Deregister of a pinned region: %v, valid %v", err, r.Valid())
	}
	r.Release()

	if !r.TryHold() {
		t.Fatal("TryHold of a registered region failed")
	}
	done := make(chan error, 1)
	go func() { done <- r.Deregister() }()
	for r.Valid() {
		time.Sleep(10 * time.Microsecond) // Deregister invalidates first
	}
	if r.TryHold() || r.TryAcquire() {
		t.Fatal("a hold or pin was granted after Deregister began")
	}
	select {
	case err := <-done:
		t.Fatalf("Deregister returned (%v) while a hold was in progress", err)
	case <-time.After(20 * time.Millisecond):
	}
	r.Unhold()
	if err := <-done; err != nil {
		t.Fatalf("Deregister after the hold ended: %v", err)
	}
	if r.InUse() || tb.Len() != 0 {
		t.Fatalf("after Deregister: in use %v, %d regions", r.InUse(), tb.Len())
	}
}

// TestDeregisterGivesUp: a hold that does not end (a peer stalled in the
// middle of an FPDU) makes Deregister fail with ErrBusy after
// deregisterWait, leaving the STag invalid; it succeeds once the hold ends.
func TestDeregisterGivesUp(t *testing.T) {
	defer func(d time.Duration) { deregisterWait = d }(deregisterWait)
	deregisterWait = 5 * time.Millisecond
	tb := NewTable()
	r := register(t, tb, Options{})
	if _, why := tb.LookupHold(r.STag()); why != OK {
		t.Fatal(why)
	}
	if err := r.Deregister(); !errors.Is(err, ErrBusy) {
		t.Fatalf("Deregister with a hold that does not end: %v", err)
	}
	if _, why := tb.Lookup(r.STag()); why != InvalidSTag || r.Valid() {
		t.Fatalf("after a Deregister that gave up: Lookup %v, valid %v", why, r.Valid())
	}
	r.Unhold()
	if err := r.Deregister(); err != nil {
		t.Fatalf("Deregister again: %v", err)
	}
}

func BenchmarkLookupHold(b *testing.B) {
	tb := NewTable()
	var stags []STag
	for range 1000 {
		stags = append(stags, register(b, tb, Options{}).STag())
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		r, _ := tb.LookupHold(stags[i%len(stags)])
		r.Unhold()
	}
}
