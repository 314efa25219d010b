package childproc

import (
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"
)

// TestMain is also the child: "serve" announces a URL and waits for its
// stdin to close; "silent" exits without one.
func TestMain(m *testing.M) {
	switch os.Getenv("CHILDPROC_TEST") {
	case "serve":
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			os.Exit(1)
		}
		fmt.Printf("http://%s\n", ln.Addr())
		io.Copy(io.Discard, os.Stdin) //nolint:errcheck // until the parent closes it
		os.Exit(0)
	case "silent":
		os.Exit(3)
	}
	os.Exit(m.Run())
}

func TestStartStop(t *testing.T) {
	t.Parallel()
	c, err := Start(t.Context(), []string{"CHILDPROC_TEST=serve"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := net.SplitHostPort(c.Addr()); err != nil {
		t.Errorf("address %q: %v", c.Addr(), err)
	}
	c.Stop(10 * time.Second)
	<-c.Done()
	if !c.Cmd.ProcessState.Success() {
		t.Errorf("the child exited %v after its stdin closed", c.Cmd.ProcessState)
	}
}

func TestKillPausedChild(t *testing.T) {
	t.Parallel()
	c, err := Start(t.Context(), []string{"CHILDPROC_TEST=serve"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	c.Cmd.Process.Signal(syscall.SIGSTOP) //nolint:errcheck // test
	c.Kill()
	<-c.Done()
}

func TestNoURLIsAnError(t *testing.T) {
	t.Parallel()
	if _, err := Start(t.Context(), []string{"CHILDPROC_TEST=silent"}, io.Discard); err == nil {
		t.Fatal("a child that announced nothing started")
	}
}
