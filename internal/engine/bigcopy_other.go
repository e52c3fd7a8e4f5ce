//go:build !amd64 || race

package engine

const useRepMovsb = false

func repMovsb(dst, src *byte, n int) { panic("engine: repMovsb without amd64") }
