package pcapstream

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"net"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/google/gopacket/pcapgo"
)

const siwDir = "../../wire/testdata/siw/"

// wantConn is what tshark 4.0 (Debian 12) says about one connection:
// `tshark -r FILE -q -z conv,tcp` for the ports and the count, and
// `tshark -r FILE -q -z follow,tcp,raw,N` for the two streams, of which the
// length and SHA-256 are kept here.
type wantConn struct {
	initPort, respPort uint16
	initLen, respLen   int
	initSHA, respSHA   string
	// ird and ord are the 4 bytes of MPA v2 private data in the request
	// (and, identically, in the reply).
	ird, ord uint16
}

var captures = map[string][]wantConn{
	"rping-64x3.pcap": {
		{44974, 7174, 516, 672,
			"ecdb1bb21dc092b08620f28f1521c4ebb8d93e091098f870c987a22bccee6f5a",
			"68e0da63bc86b9e47358eef6122971557de1169cf03813d50aaf35ee46332437", 1, 1},
	},
	"rping-5000x2.pcap": {
		{53664, 7175, 10224, 10328,
			"59a037b0af6998c05c4759cfa83b60a72d6c1b861729334a9b1d9c7ee2d8f644",
			"9db9707fee6b3d9613f47c8a79cef34b3467ce6328cf39fcc4264af0a9d06308", 1, 1},
	},
	// perftest -R: a control connection, then a data connection to the same
	// port while the control connection stays open.
	"perftest-write_bw.pcap": {
		{43550, 18515, 868, 868,
			"2d0c0b1ac08a3914573ad4d7775f256c6548f6896d2fd9f8114f44376f9eae2f",
			"f867ec499b520296087f37b153f2b8fe691b2097919996d10c0251bff7c1a516", 0, 0},
		{39681, 18515, 20604, 24,
			"7bac13104afae8cc028def7feb3274fc82ce15ea5584f98feb185ff99c84b611",
			"17822b650e6437ca0eda6e0f0e428674e68dcb95ce4e0125296e50ea3543017e", 0, 0},
	},
	"perftest-read_bw.pcap": {
		{44361, 18515, 868, 868,
			"d16ede688b1e37857ae18830881c22fa5d452a2c1fe1f1a47b9237e0fc5501b0",
			"ca7733a203c8b828e2495c5d12178fc3fa0eaee3bd46da377a9c7464760c6088", 0, 0},
		{52774, 18515, 284, 20604,
			"60cc1fc3251db7a650b0f69ae5fba1bede9b83a2daa312e0febeac173e711b2c",
			"1a3479dcc779a5355a5869e57cf81e583201c7c5301249c066977374846e221c", 128, 128},
	},
	"perftest-send_bw.pcap": {
		{51165, 18515, 708, 708,
			"6ff74fbb449c55020ee456900539be8d6f43e1f3f71d16643823ce47ce57124b",
			"cb8678f317403906c3882a5f1f1b5fc94062256475e22f02b388e2ce2bb515b3", 0, 0},
		{48648, 18515, 20624, 72,
			"dbb541e541fd0c4db17e1823c795d7a69919f9cb28a143e1de23d653a9103c14",
			"38b8a3955fbc2db1133c6c077b35f566bc56febc52e75e3ac0bcb1322f20a7ab", 0, 0},
	},
	"perftest-write_lat.pcap": {
		{37389, 18515, 628, 628,
			"1d449aab40443089e871c4315369fc1411d3f570b85a286dc2f27235c68e8940",
			"68660c152e45108902d5c68d1e0e02a26e9b5ec96bdc71127310b59da4eeae0f", 0, 0},
		{43700, 18515, 164, 164,
			"8211b382393e0b7b3148bdc08b440b9e068501e6c0778f21146ae383b04d01cf",
			"a4c26e89832f7320763cefba9ce785efe76dac04eb430be23a027dcf08629768", 0, 0},
	},
	"perftest-read_lat.pcap": {
		{35958, 18515, 708, 708,
			"c3dac8e3a8a7289e53c3d68fcba901f9a813096e89dc71d89be70b5afe6f33f0",
			"cc27b7b5e417c787e6a2f90d53e876f7137722b775b2a36ebeb33cd94d5108a2", 0, 0},
		{44561, 18515, 284, 164,
			"7e9a33e6ae848d5f080f1a4828fe0b7bac0c5e325e306258dd681386925c284d",
			"9700f9b5d905c209fe57a4a0151c26275196b6cc3d93d206dd53256426b7c121", 128, 128},
	},
	"perftest-send_lat.pcap": {
		{52317, 18515, 708, 708,
			"99eb10a1f69770c1488be2a411e4aa55dedfbcca0912983860a53b39a00bb502",
			"dc79eccbff1ad362547e535470dc561a76e1d49da832cf0b6a14c5c3e8039adb", 0, 0},
		{38009, 18515, 184, 184,
			"b7243fb989994c211f377b277bc1d6b6dbec398f1b9e109289eedf7105d6aa8e",
			"8d3c8d0fa0c886d28e6b836b6e06e4f9c62dccaca3919147fcda23f82174badb", 0, 0},
	},
}

func sum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func TestSiwCaptures(t *testing.T) {
	files, err := filepath.Glob(siwDir + "*.pcap")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != len(captures) {
		t.Errorf("%d captures in %s, want %d", len(files), siwDir, len(captures))
	}
	guest := netip.MustParseAddr("10.0.2.15")
	for _, path := range files {
		name := filepath.Base(path)
		t.Run(name, func(t *testing.T) {
			want, ok := captures[name]
			if !ok {
				t.Fatalf("no expectations for %s", name)
			}
			conns, err := ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if len(conns) != len(want) {
				t.Fatalf("%d connections, want %d", len(conns), len(want))
			}
			for i, c := range conns {
				w := want[i]
				if !strings.HasPrefix(string(c.Initiator), "MPA ID Req Frame") {
					t.Errorf("conn %d (%v): initiator stream starts %q, want MPA request key", i, &c, head(c.Initiator))
				}
				if !strings.HasPrefix(string(c.Responder), "MPA ID Rep Frame") {
					t.Errorf("conn %d (%v): responder stream starts %q, want MPA reply key", i, &c, head(c.Responder))
				}
				// siw's MPA v2 header: flags 0x10 (enhanced), rev 2,
				// private data length 4 holding IRD and ORD.
				mpa := []byte{0x10, 0x02, 0x00, 0x04, byte(w.ird >> 8), byte(w.ird), byte(w.ord >> 8), byte(w.ord)}
				for side, s := range map[string][]byte{"request": c.Initiator, "reply": c.Responder} {
					if len(s) < 24 || !bytes.Equal(s[16:24], mpa) {
						t.Errorf("conn %d: MPA %s header % x, want % x", i, side, s[16:min(24, len(s))], mpa)
					}
				}
				if c.InitiatorPort != w.initPort || c.ResponderPort != w.respPort {
					t.Errorf("conn %d: ports %d->%d, want %d->%d", i, c.InitiatorPort, c.ResponderPort, w.initPort, w.respPort)
				}
				if c.InitiatorAddr != guest || c.ResponderAddr != guest {
					t.Errorf("conn %d: addresses %v, want both %v", i, &c, guest)
				}
				if len(c.Initiator) != w.initLen || sum(c.Initiator) != w.initSHA {
					t.Errorf("conn %d: initiator stream %d bytes sha256 %s, want %d bytes %s",
						i, len(c.Initiator), sum(c.Initiator), w.initLen, w.initSHA)
				}
				if len(c.Responder) != w.respLen || sum(c.Responder) != w.respSHA {
					t.Errorf("conn %d: responder stream %d bytes sha256 %s, want %d bytes %s",
						i, len(c.Responder), sum(c.Responder), w.respLen, w.respSHA)
				}
				if !c.InitiatorFIN || !c.ResponderFIN || c.Reset {
					t.Errorf("conn %d: FIN %v/%v reset %v, want a clean close", i, c.InitiatorFIN, c.ResponderFIN, c.Reset)
				}
			}
		})
	}
}

func head(b []byte) []byte { return b[:min(len(b), 16)] }

// synth builds a capture of hand-made TCP segments.
type synth struct {
	t   *testing.T
	buf bytes.Buffer
	w   *pcapgo.Writer
	n   int
}

func newSynth(t *testing.T) *synth {
	s := &synth{t: t}
	s.w = pcapgo.NewWriter(&s.buf)
	if err := s.w.WriteFileHeader(65536, layers.LinkTypeEthernet); err != nil {
		t.Fatal(err)
	}
	return s
}

var (
	hostA = net.IPv4(192, 0, 2, 1).To4()
	hostB = net.IPv4(192, 0, 2, 2).To4()
)

// seg writes one segment from a (port ap) to b (port bp).
func (s *synth) seg(a net.IP, ap uint16, b net.IP, bp uint16, seq uint32, flags string, payload string) {
	s.t.Helper()
	eth := &layers.Ethernet{SrcMAC: net.HardwareAddr{2, 0, 0, 0, 0, a[3]}, DstMAC: net.HardwareAddr{2, 0, 0, 0, 0, b[3]}, EthernetType: layers.EthernetTypeIPv4}
	ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolTCP, SrcIP: a, DstIP: b}
	tcp := &layers.TCP{SrcPort: layers.TCPPort(ap), DstPort: layers.TCPPort(bp), Seq: seq, Window: 65535,
		SYN: strings.Contains(flags, "S"), ACK: strings.Contains(flags, "A"),
		FIN: strings.Contains(flags, "F"), RST: strings.Contains(flags, "R")}
	if err := tcp.SetNetworkLayerForChecksum(ip); err != nil {
		s.t.Fatal(err)
	}
	b2 := gopacket.NewSerializeBuffer()
	opts := gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}
	if err := gopacket.SerializeLayers(b2, opts, eth, ip, tcp, gopacket.Payload(payload)); err != nil {
		s.t.Fatal(err)
	}
	data := b2.Bytes()
	s.n++
	ci := gopacket.CaptureInfo{Timestamp: time.Unix(1700000000, int64(s.n)*1000), CaptureLength: len(data), Length: len(data)}
	if err := s.w.WritePacket(ci, data); err != nil {
		s.t.Fatal(err)
	}
}

func (s *synth) read() ([]Conn, error) { return Read(bytes.NewReader(s.buf.Bytes())) }

func TestReassemblyRetransmitReorder(t *testing.T) {
	s := newSynth(t)
	ia, ra := uint32(0xfffffff0), uint32(1000) // initiator ISN wraps around 2^32
	// Traffic of an unrelated connection that began before the capture.
	s.seg(hostB, 9, hostA, 9, 5, "A", "ignored")
	s.seg(hostA, 40000, hostB, 7174, ia, "S", "")
	s.seg(hostA, 40000, hostB, 7174, ia, "S", "") // retransmitted SYN
	s.seg(hostB, 7174, hostA, 40000, ra, "SA", "")
	s.seg(hostA, 40000, hostB, 7174, ia+1, "A", "hello ")
	s.seg(hostA, 40000, hostB, 7174, ia+14, "A", "!!")    // early, out of order
	s.seg(hostA, 40000, hostB, 7174, ia+7, "A", "world")  // fills bytes 6..10
	s.seg(hostA, 40000, hostB, 7174, ia+1, "A", "hello ") // full retransmission
	s.seg(hostA, 40000, hostB, 7174, ia+9, "A", "rld, ")  // overlaps, adds ", "
	s.seg(hostB, 7174, hostA, 40000, ra+1, "A", "reply")
	s.seg(hostB, 7174, hostA, 40000, ra+1, "A", "rep") // partial duplicate
	s.seg(hostA, 40000, hostB, 7174, ia, "A", "x")     // keepalive probe (seq-1)
	s.seg(hostA, 40000, hostB, 7174, ia+16, "FA", "")
	s.seg(hostB, 7174, hostA, 40000, ra+6, "FA", "")
	s.seg(hostB, 5555, hostA, 6666, 77, "S", "") // second conn, other direction
	s.seg(hostA, 6666, hostB, 5555, 88, "SA", "")
	s.seg(hostA, 6666, hostB, 5555, 89, "A", "second")
	s.seg(hostB, 5555, hostA, 6666, 78, "R", "")
	s.seg(hostA, 40000, hostB, 7174, 12345, "S", "") // port reuse: third conn
	s.seg(hostA, 40000, hostB, 7174, 12346, "A", "again")
	conns, err := s.read()
	if err != nil {
		t.Fatal(err)
	}
	if len(conns) != 3 {
		t.Fatalf("%d connections, want 3", len(conns))
	}
	c := conns[0]
	if got := string(c.Initiator); got != "hello world, !!" {
		t.Errorf("initiator stream %q", got)
	}
	if got := string(c.Responder); got != "reply" {
		t.Errorf("responder stream %q", got)
	}
	if c.InitiatorPort != 40000 || c.ResponderPort != 7174 || c.InitiatorAddr.String() != "192.0.2.1" || c.ResponderAddr.String() != "192.0.2.2" {
		t.Errorf("endpoints %v ports %d %d", &c, c.InitiatorPort, c.ResponderPort)
	}
	if !c.InitiatorFIN || !c.ResponderFIN || c.Reset {
		t.Errorf("FIN %v %v reset %v", c.InitiatorFIN, c.ResponderFIN, c.Reset)
	}
	c = conns[1]
	if c.InitiatorPort != 5555 || c.ResponderPort != 6666 || string(c.Responder) != "second" || len(c.Initiator) != 0 || !c.Reset {
		t.Errorf("second conn %v: %q %q reset %v", &c, c.Initiator, c.Responder, c.Reset)
	}
	if c = conns[2]; string(c.Initiator) != "again" || c.InitiatorPort != 40000 {
		t.Errorf("third conn %v: %q", &c, c.Initiator)
	}
}

func TestReassemblyHole(t *testing.T) {
	s := newSynth(t)
	s.seg(hostA, 40000, hostB, 7174, 100, "S", "")
	s.seg(hostB, 7174, hostA, 40000, 500, "SA", "")
	s.seg(hostA, 40000, hostB, 7174, 101, "A", "abc")
	s.seg(hostA, 40000, hostB, 7174, 108, "A", "xyz") // bytes 3..6 missing
	_, err := s.read()
	if err == nil || !strings.Contains(err.Error(), "hole") {
		t.Fatalf("err = %v, want a hole", err)
	}
}

func TestNotACapture(t *testing.T) {
	if _, err := Read(strings.NewReader("this is not a pcap file")); err == nil {
		t.Fatal("no error for garbage")
	}
	if _, err := ReadFile(siwDir + "does-not-exist.pcap"); err == nil {
		t.Fatal("no error for a missing file")
	}
}
