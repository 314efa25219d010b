// Package childproc re-executes the running binary as a child process
// that announces its URL on the first line of its stdout and serves until
// its stdin closes (its parent ended) or it is killed. `weir bench` runs
// its worker children this way, `weir chaos` its control planes, workers
// and simulator; the child's side is the binary's own (bench.ServeChild,
// chaos.ServeChild).
package childproc

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// Child is a running child.
type Child struct {
	Cmd *exec.Cmd
	// URL is what it announced ("http://host:port").
	URL   string
	stdin io.Closer
	done  chan struct{}
	err   error // Wait's result, set before done is closed
}

// Start runs this executable with env added to its environment and its
// stderr to stderr, and waits up to 30 s (or ctx) for its URL.
func Start(ctx context.Context, env []string, stderr io.Writer) (*Child, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &Child{Cmd: cmd, stdin: stdin, done: make(chan struct{})}
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(stdout).ReadString('\n')
		line <- strings.TrimSpace(s)
		io.Copy(io.Discard, stdout) //nolint:errcheck // drained until the child exits
		c.err = cmd.Wait()
		close(c.done)
	}()
	select {
	case c.URL = <-line:
	case <-time.After(30 * time.Second):
	case <-ctx.Done():
	}
	if !strings.HasPrefix(c.URL, "http://") {
		c.Kill()
		return nil, fmt.Errorf("child did not announce a URL (%v)", c.err)
	}
	return c, nil
}

// Addr is the child's host:port.
func (c *Child) Addr() string { return strings.TrimPrefix(c.URL, "http://") }

// Done is closed once the child has exited.
func (c *Child) Done() <-chan struct{} { return c.done }

// Kill SIGKILLs the child (a stopped one too) and waits for it.
func (c *Child) Kill() {
	c.Cmd.Process.Signal(syscall.SIGCONT) //nolint:errcheck // it may be gone
	c.Cmd.Process.Kill()                  //nolint:errcheck // it may be gone
	<-c.done
}

// Stop closes the child's stdin and waits for it to exit, killing it
// after grace.
func (c *Child) Stop(grace time.Duration) {
	c.Cmd.Process.Signal(syscall.SIGCONT) //nolint:errcheck // a paused child must run to exit
	c.stdin.Close()                       //nolint:errcheck // it reads EOF either way
	select {
	case <-c.done:
	case <-time.After(grace):
		c.Kill()
	}
}
