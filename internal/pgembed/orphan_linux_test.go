package pgembed_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/weirhq/weir/internal/pgembed"
)

// helperDirEnv tells a re-executed test binary to act as a weir that
// starts a cluster in the named directory and then waits to be killed.
const helperDirEnv = "PGEMBED_TEST_HELPER_DIR"

const readyPrefix = "PGEMBED_HELPER_READY "

// TestHelperProcess is not a test: TestOrphanPrevention runs the test binary
// again with only this test selected, as a stand-in for a weir process.
func TestHelperProcess(t *testing.T) {
	dir := os.Getenv(helperDirEnv)
	if dir == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := pgembed.Start(ctx, pgembed.Config{DataDir: dir, ExtraSettings: testSettings()})
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper: start:", err)
		os.Exit(2)
	}
	fmt.Println(readyPrefix + c.URL())
	// Block until the parent closes stdin, so a helper whose parent died
	// for some other reason still cleans up instead of lingering.
	_, _ = io.Copy(io.Discard, os.Stdin)
	_ = c.Stop(context.Background())
	os.Exit(0)
}

// TestOrphanPrevention kills a process running a cluster with SIGKILL, so
// it gets no chance to call Stop, and checks that the postmaster goes away
// anyway.
func TestOrphanPrevention(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$")
	cmd.Env = append(os.Environ(), helperDirEnv+"="+dir)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	defer func() {
		if !killed {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	}()

	lines := make(chan string, 1)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if rest, ok := strings.CutPrefix(sc.Text(), readyPrefix); ok {
				lines <- rest
				break
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	var rawURL string
	select {
	case u, ok := <-lines:
		if !ok {
			_ = cmd.Wait()
			killed = true
			t.Fatalf("helper exited without starting a cluster; stderr:\n%s", stderr.String())
		}
		rawURL = u
	case <-time.After(time.Minute):
		t.Fatalf("helper did not report a cluster in time; stderr:\n%s", stderr.String())
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatalf("helper URL %q: %v", rawURL, err)
	}
	pid := postmasterPID(t, dir)
	if !alive(pid) {
		t.Fatalf("postmaster %d not running before the kill", pid)
	}
	t.Cleanup(func() {
		// Only when the test failed, i.e. the orphan is known to be alive:
		// otherwise the pid may already belong to someone else.
		if t.Failed() && alive(pid) {
			_ = syscall.Kill(pid, syscall.SIGQUIT)
		}
	})

	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	killed = true

	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	deadline := time.NewTimer(15 * time.Second)
	defer deadline.Stop()
	for alive(pid) {
		select {
		case <-tick.C:
		case <-deadline.C:
			t.Fatalf("postmaster %d still running 15s after its parent was killed", pid)
		}
	}
	if conn, err := net.DialTimeout("tcp", u.Host, time.Second); err == nil {
		conn.Close()
		t.Fatalf("%s still accepts connections after the postmaster exited", u.Host)
	}
}

// alive reports whether pid is a running process. A zombie counts as gone:
// it has exited, and the orphan's new parent (init, or whatever runs as
// pid 1 in a container) may never reap it.
func alive(pid int) bool {
	if err := syscall.Kill(pid, 0); err != nil {
		return false
	}
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(stat)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}
