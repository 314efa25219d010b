// Command bodyflood reproduces the request-body memory attack against a
// running weir worker and reports the worker's resident memory: conns
// connections with one key, each sending a body of size bytes with its
// last byte withheld, held open for a while. See docs/reliability.md
// ("Request bodies and memory") and bench/bodyflood.sh, which runs it
// against a worker of its own.
//
//	go run ./bench/bodyflood -url http://127.0.0.1:7480 -key weir_sk_… -pid PID
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

func main() {
	base := flag.String("url", "http://127.0.0.1:7480", "the worker's URL")
	key := flag.String("key", os.Getenv("WEIR_KEY"), "a weir key (default $WEIR_KEY)")
	pid := flag.Int("pid", 0, "the worker's process id, for its RSS")
	conns := flag.Int("conns", 30, "connections")
	size := flag.Int("size", 31<<20, "each body's Content-Length in bytes")
	hold := flag.Duration("hold", 10*time.Second, "how long to keep the connections open once every body is sent")
	flag.Parse()
	if *key == "" || *pid == 0 {
		fmt.Fprintln(os.Stderr, "bodyflood: -key and -pid are required")
		os.Exit(2)
	}
	u, err := url.Parse(*base)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bodyflood:", err)
		os.Exit(2)
	}
	before := rss(*pid)
	fmt.Printf("worker RSS before: %s\n", mib(before))

	var mu sync.Mutex
	statuses := map[string]int{}
	var wg sync.WaitGroup
	var open []net.Conn
	for range *conns {
		c, err := net.Dial("tcp", u.Host)
		if err != nil {
			fmt.Fprintln(os.Stderr, "bodyflood:", err)
			os.Exit(1)
		}
		open = append(open, c)
		wg.Add(1)
		go func() {
			defer wg.Done()
			answered := make(chan string, 1)
			go func() {
				res, err := http.ReadResponse(bufio.NewReader(c), nil)
				if err != nil {
					answered <- "no answer"
					return
				}
				res.Body.Close()
				answered <- strconv.Itoa(res.StatusCode) + " " + res.Header.Get("Retry-After")
			}()
			send(c, *key, *size)
			select {
			case s := <-answered:
				mu.Lock()
				statuses["answered "+s]++
				mu.Unlock()
			case <-time.After(time.Second):
				mu.Lock()
				statuses["body sent but its last byte, still open"]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	peak := before
	for end := time.Now().Add(*hold); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		peak = max(peak, rss(*pid))
	}
	fmt.Printf("worker RSS with %d bodies of %d bytes held open: peak %s (%+.1f MiB)\n", *conns, *size, mib(peak), float64(peak-before)/(1<<20))
	if g := gauge(*base); g != "" {
		fmt.Printf("weir_dataplane_request_body_buffer_bytes %s\n", g)
	}
	for s, n := range statuses {
		fmt.Printf("  %3d × %s\n", n, s)
	}
	for _, c := range open {
		c.Close()
	}
}

// send writes the request's headers and all of its body but the last byte.
func send(c net.Conn, key string, size int) {
	head := "POST /v1/messages HTTP/1.1\r\nHost: weir\r\nContent-Type: application/json\r\nX-Api-Key: " + key +
		"\r\nAnthropic-Version: 2023-06-01\r\nContent-Length: " + strconv.Itoa(size) + "\r\n\r\n"
	if _, err := io.WriteString(c, head+`{"model":"claude-sonnet-4-5","max_tokens":8,"messages":[{"role":"user","content":"`); err != nil {
		return
	}
	chunk := []byte(strings.Repeat("a", 1<<20))
	for left := size - 90; left > 0; left -= len(chunk) {
		if _, err := c.Write(chunk[:min(left, len(chunk))]); err != nil {
			return // refused: the worker closed
		}
	}
}

// rss is the process's resident set in bytes, from /proc.
func rss(pid int) int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

// gauge reads the worker's body buffer gauge from its /metrics.
func gauge(base string) string {
	res, err := http.Get(base + "/metrics")
	if err != nil {
		return ""
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "weir_dataplane_request_body_buffer_bytes "); ok {
			return v
		}
	}
	return ""
}
