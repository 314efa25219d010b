package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"time"
)

// The apart mode's load generator is a process of its own (this binary
// re-executed as the "load" child), so the targets' CPU is theirs alone
// and the generator's is read apart. It reads one step's job as JSON on
// stdin, drives it open-loop with drive (the in-process bench's
// scheduler), and writes what it measured as JSON on stdout.

const roleLoad = "load"

// loadJob is one step as the generator runs it.
type loadJob struct {
	URL      string        `json:"url"`
	Key      string        `json:"key,omitempty"`
	Header   http.Header   `json:"header,omitempty"`
	Rate     int           `json:"rate"`
	Warmup   time.Duration `json:"warmup_ns"`
	Duration time.Duration `json:"duration_ns"`
	Stream   bool          `json:"stream"`
	Seed     uint64        `json:"seed"`
}

// loadResult is what the generator measured, and its own CPU over the
// step.
type loadResult struct {
	stepSamples
	CPU time.Duration `json:"cpu_ns"`
}

// serveLoad is the generator child: one job in, one result out.
func serveLoad(in io.Reader, out io.Writer) error {
	var job loadJob
	if err := json.NewDecoder(in).Decode(&job); err != nil {
		return fmt.Errorf("load job: %w", err)
	}
	if _, err := raiseFileLimit(16384); err != nil {
		return err
	}
	c := loadClient()
	defer c.CloseIdleConnections()
	t := target{name: "load", url: job.URL, key: job.Key, header: job.Header}
	before := readCPU().self
	s := drive(context.Background(), realClock{}, c, t, job.Rate, job.Warmup, job.Duration, job.Stream, job.Seed)
	return json.NewEncoder(out).Encode(loadResult{stepSamples: *s, CPU: readCPU().self - before})
}

// runLoad runs one step in a fresh generator process.
func runLoad(ctx context.Context, job loadJob) (loadResult, error) {
	exe, err := os.Executable()
	if err != nil {
		return loadResult{}, err
	}
	in, err := json.Marshal(job)
	if err != nil {
		return loadResult{}, err
	}
	cmd := exec.CommandContext(ctx, exe)
	cmd.Env = append(os.Environ(), childEnv+"="+roleLoad)
	cmd.Stdin = bytes.NewReader(in)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return loadResult{}, fmt.Errorf("load generator: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	var res loadResult
	if err := json.Unmarshal(stdout.Bytes(), &res); err != nil {
		return loadResult{}, fmt.Errorf("load generator's report: %w", err)
	}
	return res, nil
}
