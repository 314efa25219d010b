package sim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"
)

// sseWriter writes server-sent events, flushing each. After the first
// write error (the client went away) it writes nothing more.
type sseWriter struct {
	w   http.ResponseWriter
	rc  *http.ResponseController
	err error
}

// startStream sends the headers of a 200 event stream.
func (x *exchange) startStream() *sseWriter {
	h := x.w.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	x.setRateLimitHeaders()
	x.w.WriteHeader(http.StatusOK)
	sw := &sseWriter{w: x.w, rc: http.NewResponseController(x.w)}
	sw.flush()
	return sw
}

// event writes one event as "event: NAME\ndata: JSON\n\n".
func (sw *sseWriter) event(name string, v any) {
	if sw.err != nil {
		return
	}
	data, err := json.Marshal(v)
	if err != nil {
		sw.err = err
		return
	}
	if _, sw.err = fmt.Fprintf(sw.w, "event: %s\ndata: %s\n\n", name, data); sw.err == nil {
		sw.flush()
	}
}

// flush pushes what was written to the client. A writer that cannot flush
// still gets the whole stream, only not event by event.
func (sw *sseWriter) flush() {
	if err := sw.rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
		sw.err = err
	}
}

// pause waits d, or less if ctx ends first; it reports whether ctx is
// still live.
func pause(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
