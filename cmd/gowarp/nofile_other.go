//go:build !unix

package main

// raiseNoFile does nothing: this system has no descriptor limit to raise.
func raiseNoFile(need int) error { return nil }
