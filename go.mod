module github.com/gowarp/gowarp

go 1.26

require github.com/google/gopacket v1.1.19 // indirect
