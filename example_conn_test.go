package gowarp_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log"
	"math/big"
	"net"
	"time"

	"github.com/gowarp/gowarp"
)

// ExampleQP_ConnectConn runs gowarp over TLS: the server hands ListenOn a
// tls.Listener, the client hands ConnectConn a *tls.Conn it dialled, and
// every FPDU between them is encrypted.
func ExampleQP_ConnectConn() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	srvConf, cliConf := exampleTLS()
	dev := gowarp.Open()
	pd := dev.AllocPD()

	// Server: a TLS listener of its own, given to gowarp.
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	ln, err := dev.ListenOn(tls.NewListener(tcp, srvConf))
	if err != nil {
		log.Fatal(err)
	}
	defer ln.Close()
	srvBuf := make([]byte, 64)
	srvMR, _ := pd.Register(srvBuf, gowarp.LocalWrite)
	srvCQ := dev.NewCQ(4)
	srv, _ := pd.NewQP(gowarp.QPConfig{SendCQ: srvCQ, RecvCQ: srvCQ})
	defer srv.Close()
	srv.PostRecv(&gowarp.RecvWR{ID: 1, SGL: []gowarp.SGE{{MR: srvMR, Length: len(srvBuf)}}})
	go func() {
		req, err := ln.Accept(ctx)
		if err != nil {
			log.Fatal(err)
		}
		req.Accept(ctx, srv, gowarp.ConnectOptions{})
	}()

	// Client: a TLS connection of its own, given to its queue pair.
	c, err := tls.Dial("tcp", tcp.Addr().String(), cliConf)
	if err != nil {
		log.Fatal(err)
	}
	cq := dev.NewCQ(4)
	qp, _ := pd.NewQP(gowarp.QPConfig{SendCQ: cq, RecvCQ: cq})
	defer qp.Close()
	if err := qp.ConnectConn(ctx, c, gowarp.ConnectOptions{}); err != nil {
		log.Fatal(err)
	}
	msg := []byte("hello over TLS")
	mr, _ := pd.Register(msg, 0)
	qp.PostSend(&gowarp.SendWR{ID: 2, Op: gowarp.OpSend, SGL: []gowarp.SGE{{MR: mr, Length: len(msg)}}})

	var wc [1]gowarp.Completion
	for srvCQ.Poll(wc[:]) == 0 {
		if err := srvCQ.Wait(ctx); err != nil {
			log.Fatal(err)
		}
	}
	fmt.Printf("server received %q (%v)\n", srvBuf[:wc[0].Bytes], wc[0].Status.String())
	// Output: server received "hello over TLS" (success)
}

// exampleTLS makes a self-signed certificate for 127.0.0.1 and the
// configurations of a server that uses it and a client that trusts it.
func exampleTLS() (server, client *tls.Config) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		log.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		log.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}},
		&tls.Config{RootCAs: pool}
}
