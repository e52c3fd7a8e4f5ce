package gowarp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Adapters and placement. A Device owns adapters, each a kind of link
// (TCP from a local address, or a same-host shared-memory link); a topology table says which adapter
// has a direct, switchless link to which remote addresses. Connect places
// a new queue pair on the adapter that reaches its peer most directly and
// spreads queue pairs over the adapters that are equally direct, round
// robin; QP.Adapter reports the one it got.

// AdapterKind is the kind of link an adapter drives.
type AdapterKind uint8

// Adapter kinds.
const (
	// AdapterTCP dials TCP from the adapter's local address and listens
	// on it.
	AdapterTCP AdapterKind = iota
	// AdapterSharedMemory is the same-host link: it dials and listens as
	// AdapterTCP does (on a loopback or local address), and a queue pair
	// placed on it, connecting or accepted, asks for a shared-memory link
	// (ConnectOptions.SharedMemory), which QP.Transport then reports. A
	// peer that is no gowarp peer on this host gets TCP, as without it.
	// Of rows of equal length, one of such an adapter is the most direct.
	AdapterSharedMemory
)

func (k AdapterKind) String() string {
	switch k {
	case AdapterTCP:
		return "tcp"
	case AdapterSharedMemory:
		return "shared-memory"
	}
	return fmt.Sprintf("AdapterKind(%d)", uint8(k))
}

// AdapterConfig describes an adapter for Device.AddAdapter.
type AdapterConfig struct {
	// Name names the adapter in the device's topology; it must be unique
	// in the device and not empty.
	Name string
	// Kind is the kind of link (AdapterTCP, AdapterSharedMemory).
	Kind AdapterKind
	// LocalAddr is the adapter's own address: connections are dialed
	// from it and Adapter.Listen listens on it.
	LocalAddr netip.Addr
	// Dial, if set, opens the adapter's connections instead of a
	// net.Dialer bound to LocalAddr: a socket of another network
	// namespace or VRF, say. It should dial from local; timeout is the
	// connection's link timeout (0 for none), which bounds the dial.
	Dial func(ctx context.Context, local, remote netip.AddrPort, timeout time.Duration) (net.Conn, error)
	// Listen, if set, opens the adapter's listeners instead of
	// net.Listen on local.
	Listen func(local netip.AddrPort) (net.Listener, error)
}

// Adapter is one of a device's links: see Device.AddAdapter.
type Adapter struct {
	dev    *Device
	cfg    AdapterConfig
	placed atomic.Int64
}

// Name returns the adapter's name.
func (a *Adapter) Name() string { return a.cfg.Name }

// Kind returns the kind of link the adapter drives.
func (a *Adapter) Kind() AdapterKind { return a.cfg.Kind }

// LocalAddr returns the adapter's local address.
func (a *Adapter) LocalAddr() netip.Addr { return a.cfg.LocalAddr }

// Placed returns how many queue pairs have been placed on the adapter
// (connected through it, or accepted on its address) so far.
func (a *Adapter) Placed() int { return int(a.placed.Load()) }

func (a *Adapter) String() string { return a.cfg.Name + "(" + a.cfg.LocalAddr.String() + ")" }

// Listen listens for iWARP connections on the adapter's address and the
// given port (0 for any); queue pairs accepted from it report this
// adapter.
func (a *Adapter) Listen(port uint16) (*Listener, error) {
	local := netip.AddrPortFrom(a.cfg.LocalAddr, port)
	var ln net.Listener
	var err error
	if a.cfg.Listen != nil {
		ln, err = a.cfg.Listen(local)
	} else {
		ln, err = net.Listen("tcp", local.String())
	}
	if err != nil {
		return nil, fmt.Errorf("gowarp: adapter %s: %w", a.cfg.Name, err)
	}
	return a.dev.ListenOn(ln)
}

// dial opens a TCP connection from the adapter to remote, bounded by
// timeout (none if not positive); a dial that times out so wraps
// ErrLinkTimeout, as Connect's does.
func (a *Adapter) dial(ctx context.Context, remote netip.AddrPort, timeout time.Duration) (net.Conn, error) {
	local := netip.AddrPortFrom(a.cfg.LocalAddr, 0)
	var c net.Conn
	var err error
	if a.cfg.Dial != nil {
		c, err = a.cfg.Dial(ctx, local, remote, timeout)
	} else {
		d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(local), Timeout: max(timeout, 0)}
		c, err = d.DialContext(ctx, "tcp", remote.String())
	}
	if err != nil {
		var ne net.Error
		if ctx.Err() == nil && errors.As(err, &ne) && ne.Timeout() {
			err = fmt.Errorf("%w: %w", ErrLinkTimeout, err)
		}
		return nil, fmt.Errorf("gowarp: connect %s from adapter %s: %w", remote, a.cfg.Name, err)
	}
	return c, nil
}

// DirectLink is one row of a topology table: the adapter named Adapter
// has a direct, switchless link to the peers whose addresses lie in
// Remote (a single peer is a /32 or /128).
type DirectLink struct {
	Adapter string
	Remote  netip.Prefix
}

// Topology is a device's table of direct links. A peer reached by several
// rows is reached most directly by the longest prefix; rows of equal
// length are equally direct.
type Topology []DirectLink

// adapterSet is a device's adapters and topology.
type adapterSet struct {
	mu       sync.RWMutex
	adapters []*Adapter
	topo     Topology
	rr       atomic.Uint32 // round robin among equally direct adapters
}

// qpOwner is the root package's record of a queue pair (engine.Config's
// Owner): its device, and the adapter it was placed on.
type qpOwner struct {
	dev     *Device
	adapter atomic.Pointer[Adapter]
}

// AddAdapter adds an adapter to the device. A name already in use, an
// empty one, an unknown kind or an invalid address is ErrBadConfig.
func (d *Device) AddAdapter(c AdapterConfig) (*Adapter, error) {
	if c.Name == "" || !c.LocalAddr.IsValid() || c.Kind > AdapterSharedMemory {
		return nil, fmt.Errorf("%w: adapter %q: a name, a valid local address and a known kind are needed", ErrBadConfig, c.Name)
	}
	s := &d.adapters
	s.mu.Lock()
	defer s.mu.Unlock()
	if slices.ContainsFunc(s.adapters, func(a *Adapter) bool { return a.cfg.Name == c.Name }) {
		return nil, fmt.Errorf("%w: adapter %q added twice", ErrBadConfig, c.Name)
	}
	a := &Adapter{dev: d, cfg: c}
	s.adapters = append(s.adapters, a)
	return a, nil
}

// Adapters returns the device's adapters, in the order they were added.
func (d *Device) Adapters() []*Adapter {
	d.adapters.mu.RLock()
	defer d.adapters.mu.RUnlock()
	return slices.Clone(d.adapters.adapters)
}

// SetTopology replaces the device's topology table. A row naming no
// adapter of the device, or with an invalid prefix, is ErrBadConfig, and
// then nothing changes. Queue pairs already connected stay where they are.
func (d *Device) SetTopology(t Topology) error {
	s := &d.adapters
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, l := range t {
		if !l.Remote.IsValid() || s.find(l.Adapter) == nil {
			return fmt.Errorf("%w: topology row %s -> %v: no such adapter or an invalid prefix", ErrBadConfig, l.Adapter, l.Remote)
		}
	}
	s.topo = slices.Clone(t)
	return nil
}

// Topology returns the device's topology table.
func (d *Device) Topology() Topology {
	d.adapters.mu.RLock()
	defer d.adapters.mu.RUnlock()
	return slices.Clone(d.adapters.topo)
}

func (s *adapterSet) find(name string) *Adapter {
	for _, a := range s.adapters {
		if a.cfg.Name == name {
			return a
		}
	}
	return nil
}

// Place returns the adapter a queue pair to remote is placed on: of the
// adapters whose topology rows reach remote, those with the longest
// prefix (and of those, shared-memory adapters before TCP ones), taken in
// turn (round robin) by successive calls. Nil if no row
// reaches remote: Connect then dials as the system routes.
func (d *Device) Place(remote netip.Addr) *Adapter {
	s := &d.adapters
	s.mu.RLock()
	defer s.mu.RUnlock()
	remote = remote.Unmap()
	best := -1
	var cand [8]*Adapter // equally direct adapters; more are rare
	n := 0
	for _, l := range s.topo {
		if !l.Remote.Contains(remote) {
			continue
		}
		a := s.find(l.Adapter)
		b := 2 * l.Remote.Bits() // ranks: the prefix, then the kind
		if a.cfg.Kind == AdapterSharedMemory {
			b++
		}
		switch {
		case b > best:
			best, n = b, 0
			fallthrough
		case b == best && n < len(cand) && !slices.Contains(cand[:n], a):
			cand[n] = a
			n++
		}
	}
	if n == 0 {
		return nil
	}
	return cand[int(s.rr.Add(1)-1)%n]
}

// Adapter returns the adapter the queue pair was placed on, nil if none:
// the device has no adapter reaching its peer, or it was connected over
// a stream of the caller's (ConnectConn, a Listener not an adapter's).
func (qp *QP) Adapter() *Adapter {
	if o, ok := qp.q.Owner().(*qpOwner); ok {
		return o.adapter.Load()
	}
	return nil
}

// placement returns the adapter the device's topology places a queue
// pair to addr on, nil if none does (addr is no IP literal, or no row
// reaches it).
func (qp *QP) placement(addr string) (*Adapter, netip.AddrPort) {
	o, ok := qp.q.Owner().(*qpOwner)
	if !ok {
		return nil, netip.AddrPort{}
	}
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return nil, netip.AddrPort{}
	}
	return o.dev.Place(ap.Addr()), ap
}

// ConnectVia connects an idle queue pair to a listening peer at addr
// (ip:port) through adapter a, whatever the topology says: TCP from the
// adapter's address, then MPA, as Connect. QP.Adapter reports a from
// then on. A dial that fails closes the queue pair, as Connect's does.
func (qp *QP) ConnectVia(ctx context.Context, a *Adapter, addr string, o ConnectOptions) error {
	ap, err := netip.ParseAddrPort(addr)
	if a == nil || err != nil {
		qp.Close()
		return fmt.Errorf("%w: ConnectVia needs an adapter and an ip:port (%q)", ErrBadConfig, addr)
	}
	if err := ctx.Err(); err != nil {
		return err // nothing tried: the queue pair stays idle, as Connect's
	}
	return qp.connectVia(ctx, a, ap, o)
}

func (qp *QP) connectVia(ctx context.Context, a *Adapter, ap netip.AddrPort, o ConnectOptions) error {
	timeout := o.LinkTimeout
	if timeout == 0 {
		timeout = DefaultLinkTimeout
	}
	c, err := a.dial(ctx, ap, timeout)
	if err != nil {
		qp.Close()
		return err
	}
	if a.cfg.Kind == AdapterSharedMemory {
		o.SharedMemory = true
	}
	qp.setAdapter(a)
	return qp.ConnectConn(ctx, c, o)
}

func (qp *QP) setAdapter(a *Adapter) {
	if o, ok := qp.q.Owner().(*qpOwner); ok && a != nil {
		o.adapter.Store(a)
		a.placed.Add(1)
	}
}

// acceptedOn returns the adapter whose address local is, for a queue
// pair accepted there; nil if none is.
func (qp *QP) acceptedOn(local net.Addr) *Adapter {
	o, ok := qp.q.Owner().(*qpOwner)
	ta, ok2 := local.(*net.TCPAddr)
	if !ok || !ok2 {
		return nil
	}
	ip := ta.AddrPort().Addr().Unmap()
	s := &o.dev.adapters
	s.mu.RLock()
	i := slices.IndexFunc(s.adapters, func(a *Adapter) bool { return a.cfg.LocalAddr.Unmap() == ip })
	var a *Adapter
	if i >= 0 {
		a = s.adapters[i]
	}
	s.mu.RUnlock()
	return a
}
