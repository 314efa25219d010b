package bench

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime"
	"runtime/debug"
	"strings"
	"time"

	"github.com/weirhq/weir/dataplane"
	"github.com/weirhq/weir/internal/childproc"
)

// Worker processes for the idle-stream step. In production a data-plane
// worker runs apart from the control plane, the agents and the upstream;
// in the bench's one process an open stream's memory also carries the
// control plane's garbage from leasing it (every idle stream holds a
// lease of its own) and the load generator's. So the step also opens the
// streams through a child process that serves one proxy, a weir worker
// pointed at the in-process control plane or the bare proxy, and reads
// that process's own RSS.

// childEnv names the role of a re-executed bench child.
const childEnv = "WEIR_BENCH_CHILD"

// ServeChild makes this process a bench child when the environment asks
// for one (weir bench starts them with os.Executable), serving until its
// stdin closes, and then exits. A binary that runs the bench calls it
// first, before anything else reads flags or starts servers.
func ServeChild() {
	role := os.Getenv(childEnv)
	if role == "" {
		return
	}
	if err := serveChild(role); err != nil {
		fmt.Fprintln(os.Stderr, "weir bench child:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func serveChild(role string) error {
	if role == roleLoad {
		return serveLoad(os.Stdin, os.Stdout)
	}
	var h http.Handler
	switch role {
	case "bare":
		bp, err := bareProxy(os.Getenv("WEIR_BENCH_UPSTREAM"))
		if err != nil {
			return err
		}
		h = bp
	case "weir":
		dp, err := dataplane.New(dataplane.Config{
			ControlPlaneURL: os.Getenv("WEIR_CONTROLPLANE_URL"), Token: os.Getenv("WEIR_DATAPLANE_TOKEN"),
			Logger: slog.New(slog.DiscardHandler),
		})
		if err != nil {
			return err
		}
		defer dp.Close(context.Background()) //nolint:errcheck // the process ends
		h = dp.Handler()
	default:
		return fmt.Errorf("unknown role %q", role)
	}
	mux := http.NewServeMux()
	// What the parent reads must be what the streams hold, not the garbage
	// of opening them: it asks for a collection first.
	mux.HandleFunc("/_bench/gc", func(w http.ResponseWriter, _ *http.Request) {
		json.NewEncoder(w).Encode(collectGo()) //nolint:errcheck // the parent sees a short body
	})
	mux.Handle("/", h)
	// A peer started by command line names its address in advance.
	ln, err := net.Listen("tcp", cmp.Or(os.Getenv("WEIR_BENCH_LISTEN"), "127.0.0.1:0"))
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln) //nolint:errcheck // ends with Close
	fmt.Printf("http://%s\n", ln.Addr())
	io.Copy(io.Discard, os.Stdin) //nolint:errcheck // returns when the parent closes stdin or exits
	return srv.Close()
}

// child is a running bench child.
type child struct{ *childproc.Child }

// startChild starts this executable as a child serving role, with env
// added to its environment, and waits for its address.
func startChild(ctx context.Context, role string, env ...string) (*child, error) {
	var stderr strings.Builder
	c, err := childproc.Start(ctx, append([]string{childEnv + "=" + role}, env...), &stderr)
	if err != nil {
		return nil, fmt.Errorf("bench child %s did not start: %s", role, strings.TrimSpace(stderr.String()))
	}
	return &child{c}, nil
}

// stop closes the child's stdin and waits for it, killing it after 10 s.
func (c *child) stop() { c.Stop(10 * time.Second) }

// meter is where an idle-stream measurement reads memory: this process,
// or a child.
type meter interface {
	// collect runs a GC, returns free memory to the OS (what is read next
	// is what is held, not the garbage of getting there) and reports Go's
	// own accounting.
	collect(ctx context.Context) (goMem, error)
	read() (memStatus, error)
	resetPeak() error
}

// goMem is Go's own accounting of a process's memory, after a GC.
type goMem struct {
	HeapInuse  int64 `json:"heap_inuse_bytes"`
	StackInuse int64 `json:"stack_inuse_bytes"`
	Goroutines int   `json:"goroutines"`
}

// collectGo is collect for the process it runs in.
func collectGo() goMem {
	runtime.GC()
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return goMem{HeapInuse: int64(ms.HeapInuse), StackInuse: int64(ms.StackInuse), Goroutines: runtime.NumGoroutine()}
}

type selfMeter struct{}

func (selfMeter) collect(context.Context) (goMem, error) { return collectGo(), nil }
func (selfMeter) read() (memStatus, error)               { return readMem("/proc/self/status") }
func (selfMeter) resetPeak() error                       { return resetPeak("/proc/self/clear_refs") }

func (c *child) collect(ctx context.Context) (goMem, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.URL+"/_bench/gc", nil)
	if err != nil {
		return goMem{}, err
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return goMem{}, err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return goMem{}, errors.New("bench child: collect: " + res.Status)
	}
	var m goMem
	if err := json.NewDecoder(res.Body).Decode(&m); err != nil {
		return goMem{}, fmt.Errorf("bench child: collect: %w", err)
	}
	return m, nil
}

func (c *child) read() (memStatus, error) {
	return readMem(fmt.Sprintf("/proc/%d/status", c.Cmd.Process.Pid))
}

func (c *child) resetPeak() error {
	return resetPeak(fmt.Sprintf("/proc/%d/clear_refs", c.Cmd.Process.Pid))
}
