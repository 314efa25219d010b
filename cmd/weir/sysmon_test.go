package main

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/weirhq/weir/internal/sysmon"
)

func TestServesRequests(t *testing.T) {
	for args, want := range map[string]bool{
		"": false, "dev --simulate": true, "controlplane": true, "dataplane": true,
		"keys list": false, "sim": false, "bench apart": false, "chaos": false, "migrate": false,
	} {
		if got := servesRequests(strings.Fields(args)); got != want {
			t.Errorf("servesRequests(%q) = %v, want %v", args, got, want)
		}
	}
}

// TestDataplaneRunsWithSteadySysmon starts this test binary as `weir
// dataplane` and reads the environment of the running process, once it
// serves: the command re-executed itself, as the same process, with the
// runtime's monitor kept polling steadily; with GODEBUG=schedtrace=0 it
// runs as it was started.
func TestDataplaneRunsWithSteadySysmon(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		godebug, want string
	}{
		{"", "GODEBUG=" + sysmon.Setting},
		{"schedtrace=0", "GODEBUG=schedtrace=0"},
	} {
		t.Run("GODEBUG="+tc.godebug, func(t *testing.T) {
			cmd := exec.Command(exe, "dataplane", "--listen", "127.0.0.1:0", "--controlplane", "http://127.0.0.1:1")
			cmd.Env = append(slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "GODEBUG=") }),
				asWeirEnv+"=1", "WEIR_DATAPLANE_TOKEN=test", "WEIR_LOG_LEVEL=info", "GODEBUG="+tc.godebug)
			stderr, err := cmd.StderrPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				cmd.Process.Kill() //nolint:errcheck // it may have exited
				cmd.Wait()         //nolint:errcheck // killed
			})
			// Once it listens, main is running: any re-execution is behind it.
			lines := bufio.NewScanner(stderr)
			listening := false
			for lines.Scan() {
				if strings.Contains(lines.Text(), "data plane listening") {
					listening = true
					break
				}
			}
			if !listening {
				t.Fatalf("the data plane never said it listens: %v", lines.Err())
			}
			go func() {
				for lines.Scan() { // keep the pipe drained
				}
			}()
			raw, err := os.ReadFile("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/environ")
			if err != nil {
				t.Fatal(err)
			}
			var godebug []string
			for kv := range bytes.SplitSeq(raw, []byte{0}) {
				if bytes.HasPrefix(kv, []byte("GODEBUG=")) {
					godebug = append(godebug, string(kv))
				}
			}
			if !slices.Equal(godebug, []string{tc.want}) {
				t.Errorf("the running data plane's GODEBUG: %q, want %q", godebug, tc.want)
			}
		})
	}
}
