// Command tlswrite runs gowarp over TLS: the connection is a crypto/tls
// one the program opens itself, handed to gowarp with QP.ConnectConn on
// the client and Device.ListenOn on the server, so every FPDU travels
// encrypted.
//
//	tlswrite server [-a ADDR] [-p 7475] [-cert FILE -key FILE | -certout FILE]
//	tlswrite client [-s 127.0.0.1] [-p 7475] [-ca FILE] [-text TEXT]
//
// The server advertises a buffer (address, STag, length) in the private
// data of its accept; the client RDMA-Writes the text into it, Reads it
// back, and Sends the length as a notice; the server prints what was
// placed. Without -cert the server makes a self-signed certificate for
// its address and writes it to -certout, for the client's -ca.
package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"log"
	"math/big"
	"net"
	"os"
	"os/signal"
	"strconv"
	"time"

	"github.com/gowarp/gowarp"
)

func main() {
	log.SetFlags(0)
	log.SetPrefix("tlswrite: ")
	if len(os.Args) < 2 || (os.Args[1] != "server" && os.Args[1] != "client") {
		fmt.Fprintln(os.Stderr, "usage: tlswrite server|client [flags]  (tlswrite server -h for the flags)")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	fs := flag.NewFlagSet("tlswrite "+os.Args[1], flag.ExitOnError)
	port := fs.Int("p", 7475, "port")
	if os.Args[1] == "server" {
		addr := fs.String("a", "127.0.0.1", "address to listen on")
		cert := fs.String("cert", "", "certificate file (PEM); with -key")
		key := fs.String("key", "", "private key file (PEM)")
		certOut := fs.String("certout", "tlswrite-cert.pem", "without -cert: where to write the self-signed certificate made for -a")
		fs.Parse(os.Args[2:])
		conf, err := serverTLS(*cert, *key, *certOut, *addr)
		if err != nil {
			log.Fatal(err)
		}
		if err := serve(ctx, net.JoinHostPort(*addr, strconv.Itoa(*port)), conf); err != nil {
			log.Fatal(err)
		}
		return
	}
	server := fs.String("s", "127.0.0.1", "server address")
	ca := fs.String("ca", "", "the server's certificate or its CA (PEM); default the system's roots")
	text := fs.String("text", "hello over TLS", "what to write")
	timeout := fs.Duration("timeout", 10*time.Second, "give up after this long")
	fs.Parse(os.Args[2:])
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	if err := write(ctx, *server, strconv.Itoa(*port), *ca, *text); err != nil {
		log.Fatal(err)
	}
}

// bufSize is the server's advertised buffer.
const bufSize = 4096

// serve accepts one client over TLS and prints what it wrote.
func serve(ctx context.Context, addr string, conf *tls.Config) error {
	tcp, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	dev := gowarp.Open()
	// gowarp owns the listener from here, and closes it.
	ln, err := dev.ListenOn(tls.NewListener(tcp, conf))
	if err != nil {
		return err
	}
	defer ln.Close()
	fmt.Println("listening on", ln.Addr())
	pd := dev.AllocPD()
	buf := make([]byte, bufSize)
	mr, err := pd.Register(buf, gowarp.LocalWrite|gowarp.RemoteWrite|gowarp.RemoteRead)
	if err != nil {
		return err
	}
	note := make([]byte, 8)
	nmr, err := pd.Register(note, gowarp.LocalWrite)
	if err != nil {
		return err
	}
	cq := dev.NewCQ(4)
	qp, err := pd.NewQP(gowarp.QPConfig{SendCQ: cq, RecvCQ: cq})
	if err != nil {
		return err
	}
	defer qp.Close()
	if err := qp.PostRecv(&gowarp.RecvWR{ID: 1, SGL: []gowarp.SGE{{MR: nmr, Length: len(note)}}}); err != nil {
		return err
	}
	req, err := ln.Accept(ctx)
	if err != nil {
		return err
	}
	adv := binary.BigEndian.AppendUint64(nil, mr.Addr())
	adv = binary.BigEndian.AppendUint32(adv, uint32(mr.STag()))
	adv = binary.BigEndian.AppendUint32(adv, bufSize)
	if err := req.Accept(ctx, qp, gowarp.ConnectOptions{PrivateData: adv}); err != nil {
		return err
	}
	// The notice is a Send behind the Write and the Read: when it
	// arrives, the Write is placed.
	if _, err := next(ctx, cq); err != nil {
		return err
	}
	n := binary.BigEndian.Uint64(note)
	if n > bufSize {
		return fmt.Errorf("client says it wrote %d bytes, more than the buffer", n)
	}
	fmt.Printf("client %v wrote %d bytes over TLS: %q\n", req.RemoteAddr(), n, buf[:n])
	return nil
}

// write connects over TLS, Writes text into the server's buffer, Reads it
// back and Sends its length.
func write(ctx context.Context, host, port, caFile, text string) error {
	conf := &tls.Config{ServerName: host}
	if caFile != "" {
		caPEM, err := os.ReadFile(caFile)
		if err != nil {
			return err
		}
		conf.RootCAs = x509.NewCertPool()
		if !conf.RootCAs.AppendCertsFromPEM(caPEM) {
			return fmt.Errorf("%s: no certificate", caFile)
		}
	}
	d := tls.Dialer{Config: conf}
	c, err := d.DialContext(ctx, "tcp", net.JoinHostPort(host, port))
	if err != nil {
		return err
	}
	dev := gowarp.Open()
	pd := dev.AllocPD()
	cq := dev.NewCQ(8)
	qp, err := pd.NewQP(gowarp.QPConfig{SendCQ: cq, RecvCQ: cq})
	if err != nil {
		c.Close()
		return err
	}
	defer qp.Close()
	// The queue pair owns c from here on, and closes it.
	if err := qp.ConnectConn(ctx, c, gowarp.ConnectOptions{}); err != nil {
		return err
	}
	adv := qp.PeerPrivateData()
	if len(adv) != 16 {
		return fmt.Errorf("server advertised %d bytes, want 16", len(adv))
	}
	raddr, rkey, rlen := binary.BigEndian.Uint64(adv), binary.BigEndian.Uint32(adv[8:]), binary.BigEndian.Uint32(adv[12:])
	if len(text) > int(rlen) {
		return fmt.Errorf("text of %d bytes, the server's buffer holds %d", len(text), rlen)
	}
	buf := make([]byte, 2*len(text)+8)
	mr, err := pd.Register(buf, gowarp.LocalWrite)
	if err != nil {
		return err
	}
	n := len(text)
	copy(buf, text)
	binary.BigEndian.PutUint64(buf[2*n:], uint64(n))
	wrs := []gowarp.SendWR{
		{ID: 1, Op: gowarp.OpWrite, SGL: []gowarp.SGE{{MR: mr, Length: n}}, RemoteAddr: raddr, RKey: gowarp.STag(rkey)},
		{ID: 2, Op: gowarp.OpRead, Flags: gowarp.Signaled, SGL: []gowarp.SGE{{MR: mr, Offset: n, Length: n}}, RemoteAddr: raddr, RKey: gowarp.STag(rkey)},
		{ID: 3, Op: gowarp.OpSend, Flags: gowarp.Signaled | gowarp.Fence, SGL: []gowarp.SGE{{MR: mr, Offset: 2 * n, Length: 8}}},
	}
	if _, err := qp.PostSendList(wrs); err != nil {
		return err
	}
	for range 2 {
		if _, err := next(ctx, cq); err != nil {
			return err
		}
	}
	if string(buf[n:2*n]) != text {
		return fmt.Errorf("read back %q, wrote %q", buf[n:2*n], text)
	}
	fmt.Printf("wrote %d bytes over TLS and read them back\n", n)
	return qp.Disconnect(ctx)
}

// next waits for one completion and returns it, or its error.
func next(ctx context.Context, cq *gowarp.CQ) (gowarp.Completion, error) {
	var wc [1]gowarp.Completion
	for cq.Poll(wc[:]) == 0 {
		if err := cq.Wait(ctx); err != nil {
			return wc[0], err
		}
	}
	if err := wc[0].Err(); err != nil {
		if qerr := wc[0].QP.Err(); qerr != nil {
			return wc[0], fmt.Errorf("work request %d (%v): %w: %w", wc[0].ID, wc[0].Op, err, qerr)
		}
		return wc[0], fmt.Errorf("work request %d (%v): %w", wc[0].ID, wc[0].Op, err)
	}
	return wc[0], nil
}

// serverTLS loads the server's certificate, or makes a self-signed one for
// host and writes it to certOut.
func serverTLS(certFile, keyFile, certOut, host string) (*tls.Config, error) {
	if certFile != "" || keyFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, err
		}
		return &tls.Config{Certificates: []tls.Certificate{cert}}, nil
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: "tlswrite " + host},
		NotBefore:    time.Now().Add(-time.Minute),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if ip := net.ParseIP(host); ip != nil {
		tmpl.IPAddresses = []net.IP{ip}
	} else if host != "" {
		tmpl.DNSNames = []string{host}
	} else {
		return nil, errors.New("-a is needed to make a certificate (or give -cert and -key)")
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(certOut, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return nil, err
	}
	fmt.Println("self-signed certificate in", certOut)
	return &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}, nil
}
