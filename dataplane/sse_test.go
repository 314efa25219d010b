package dataplane

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

// scanAll reads events until the scanner fails and returns them with the
// error that ended the scan.
func scanAll(t testing.TB, r io.Reader) ([]sseEvent, error) {
	t.Helper()
	sc := newSSEScanner(r)
	var evs []sseEvent
	for {
		ev, err := sc.next()
		if err != nil {
			return evs, err
		}
		evs = append(evs, ev)
		if len(evs) > 1<<20 {
			t.Fatal("scanner does not make progress")
		}
	}
}

func TestSSEScanner(t *testing.T) {
	t.Parallel()
	type want struct{ name, data, raw string }
	tests := []struct {
		name    string
		in      string
		want    []want
		wantErr error
	}{
		{
			name: "two events",
			in:   "event: message_start\ndata: {\"type\":\"message_start\"}\n\nevent: ping\ndata: {\"type\":\"ping\"}\n\n",
			want: []want{
				{"message_start", `{"type":"message_start"}`, "event: message_start\ndata: {\"type\":\"message_start\"}\n\n"},
				{"ping", `{"type":"ping"}`, "event: ping\ndata: {\"type\":\"ping\"}\n\n"},
			},
			wantErr: io.EOF,
		},
		{
			name:    "CRLF line endings",
			in:      "event: ping\r\ndata: {\"type\":\"ping\"}\r\n\r\nevent: message_stop\r\ndata: {}\r\n\r\n",
			want:    []want{{"ping", `{"type":"ping"}`, "event: ping\r\ndata: {\"type\":\"ping\"}\r\n\r\n"}, {"message_stop", "{}", "event: message_stop\r\ndata: {}\r\n\r\n"}},
			wantErr: io.EOF,
		},
		{
			name:    "multi-line data joined by newlines, default name",
			in:      "data: first\ndata: second\ndata:third\n\n",
			want:    []want{{"message", "first\nsecond\nthird", "data: first\ndata: second\ndata:third\n\n"}},
			wantErr: io.EOF,
		},
		{
			name:    "only the first space after the colon is dropped",
			in:      "event:  spaced\ndata:  two\n\n",
			want:    []want{{" spaced", " two", "event:  spaced\ndata:  two\n\n"}},
			wantErr: io.EOF,
		},
		{
			name:    "comments, ids and unknown fields are kept in raw only",
			in:      ": keepalive\nid: 7\nretry: 100\nevent: x\ndata: y\n\n",
			want:    []want{{"x", "y", ": keepalive\nid: 7\nretry: 100\nevent: x\ndata: y\n\n"}},
			wantErr: io.EOF,
		},
		{
			name: "a stray blank line stays with the next event",
			in:   "\nevent: a\ndata: 1\n\n\r\nevent: b\ndata: 2\n\n",
			want: []want{
				{"a", "1", "\nevent: a\ndata: 1\n\n"},
				{"b", "2", "\r\nevent: b\ndata: 2\n\n"},
			},
			wantErr: io.EOF,
		},
		{
			// Two blank lines in a row end an empty event: nothing of it is
			// interpreted, but its bytes are still relayed.
			name: "two stray blank lines",
			in:   "event: a\ndata: 1\n\n\n\nevent: b\ndata: 2\n\n",
			want: []want{
				{"a", "1", "event: a\ndata: 1\n\n"},
				{"message", "", "\n\n"},
				{"b", "2", "event: b\ndata: 2\n\n"},
			},
			wantErr: io.EOF,
		},
		{
			name:    "empty stream",
			in:      "",
			wantErr: io.EOF,
		},
		{
			name:    "cut after a field line",
			in:      "event: a\ndata: 1\n\nevent: b\ndata: 2\n",
			want:    []want{{"a", "1", "event: a\ndata: 1\n\n"}},
			wantErr: io.ErrUnexpectedEOF,
		},
		{
			name:    "cut inside a line",
			in:      "event: a\ndata: 1\n\nevent: b\nda",
			want:    []want{{"a", "1", "event: a\ndata: 1\n\n"}},
			wantErr: io.ErrUnexpectedEOF,
		},
		{
			name:    "cut before the blank line of the only event",
			in:      "event: error\ndata: {}",
			wantErr: io.ErrUnexpectedEOF,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			evs, err := scanAll(t, strings.NewReader(tt.in))
			if !errors.Is(err, tt.wantErr) || (tt.wantErr == io.EOF && err != io.EOF) {
				t.Fatalf("error = %v, want %v", err, tt.wantErr)
			}
			if len(evs) != len(tt.want) {
				t.Fatalf("got %d events, want %d: %+v", len(evs), len(tt.want), evs)
			}
			for i, w := range tt.want {
				ev := evs[i]
				if ev.name != w.name || string(ev.data) != w.data || string(ev.raw) != w.raw {
					t.Errorf("event %d = {name %q data %q raw %q}, want {name %q data %q raw %q}",
						i, ev.name, ev.data, ev.raw, w.name, w.data, w.raw)
				}
			}
		})
	}
}

// TestSSEScannerRawBytesExact relays a realistic stream: the concatenated
// raw bytes must be the input, byte for byte, whatever the line endings.
func TestSSEScannerRawBytesExact(t *testing.T) {
	t.Parallel()
	in := "event: message_start\n" +
		"data: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":12,\"output_tokens\":1}}}\n\n" +
		": a comment the client should still see\r\n\r\n" +
		"event: content_block_delta\r\n" +
		"data: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":\"h\\u00e9llo \\n\"}}\r\n\r\n" +
		"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
	evs, err := scanAll(t, strings.NewReader(in))
	if err != io.EOF {
		t.Fatalf("error = %v, want io.EOF", err)
	}
	var got bytes.Buffer
	for _, ev := range evs {
		got.Write(ev.raw)
	}
	if got.String() != in {
		t.Fatalf("raw bytes differ:\n got %q\nwant %q", got.String(), in)
	}
	// The comment-only block is an event of its own (name "message", no data).
	names := []string{}
	for _, ev := range evs {
		names = append(names, ev.name)
	}
	if want := "message_start,message,content_block_delta,message_stop"; strings.Join(names, ",") != want {
		t.Fatalf("names = %v, want %s", names, want)
	}
}

// TestSSEScannerLongLine crosses the 32 KiB read buffer inside one line.
func TestSSEScannerLongLine(t *testing.T) {
	t.Parallel()
	payload := strings.Repeat("x", 100<<10)
	in := "event: big\ndata: " + payload + "\n\nevent: small\ndata: s\n\n"
	evs, err := scanAll(t, strings.NewReader(in))
	if err != io.EOF {
		t.Fatalf("error = %v, want io.EOF", err)
	}
	if len(evs) != 2 || evs[0].name != "big" || string(evs[0].data) != payload || evs[1].name != "small" {
		t.Fatalf("unexpected events: %d", len(evs))
	}
	if string(evs[0].raw)+string(evs[1].raw) != in {
		t.Fatal("raw bytes differ from the input")
	}
}

func TestSSEScannerOversizedEvent(t *testing.T) {
	t.Parallel()
	t.Run("one long line", func(t *testing.T) {
		t.Parallel()
		in := "event: big\ndata: " + strings.Repeat("x", maxSSEEvent+1) + "\n\n"
		_, err := scanAll(t, strings.NewReader(in))
		if !errors.Is(err, errSSETooLarge) {
			t.Fatalf("error = %v, want errSSETooLarge", err)
		}
	})
	t.Run("many short lines", func(t *testing.T) {
		t.Parallel()
		line := "data: " + strings.Repeat("y", 1000) + "\n"
		in := "event: ok\ndata: 1\n\nevent: big\n" + strings.Repeat(line, maxSSEEvent/len(line)+2) + "\n"
		evs, err := scanAll(t, strings.NewReader(in))
		if !errors.Is(err, errSSETooLarge) {
			t.Fatalf("error = %v, want errSSETooLarge", err)
		}
		if len(evs) != 1 || evs[0].name != "ok" {
			t.Fatalf("events before the oversized one = %+v", evs)
		}
	})
	t.Run("exactly at the limit is fine", func(t *testing.T) {
		t.Parallel()
		head := "data: "
		in := head + strings.Repeat("z", maxSSEEvent-len(head)-2) + "\n\n"
		evs, err := scanAll(t, strings.NewReader(in))
		if err != io.EOF || len(evs) != 1 || len(evs[0].raw) != maxSSEEvent {
			t.Fatalf("got %d events, err %v", len(evs), err)
		}
	})
}

// chunkReader returns its chunks one Read at a time, the way a network
// connection delivers an event stream in pieces.
type chunkReader struct{ chunks []string }

func (c *chunkReader) Read(p []byte) (int, error) {
	if len(c.chunks) == 0 {
		return 0, io.EOF
	}
	n := copy(p, c.chunks[0])
	c.chunks[0] = c.chunks[0][n:]
	if c.chunks[0] == "" {
		c.chunks = c.chunks[1:]
	}
	return n, nil
}

// TestSSEScannerDataSurvivesShortReads: an event's data must not depend on
// how the bytes were split across reads.
func TestSSEScannerDataSurvivesShortReads(t *testing.T) {
	t.Parallel()
	const delta = "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":42}}\n"
	const stop = "\nevent: message_stop\ndata: {\"type\":\"message_stop\",\"pad\":\"" + "................................................................" + "\"}\n\n"
	cases := map[string]io.Reader{
		"one byte at a time": iotest.OneByteReader(strings.NewReader("data: AAAA\ndata: BBBB\n\n")),
		// The blank line ending message_delta arrives with the next event.
		"blank line in the next read": &chunkReader{chunks: []string{delta, stop}},
	}
	want := map[string][]string{
		"one byte at a time":          {"AAAA\nBBBB"},
		"blank line in the next read": {`{"type":"message_delta","usage":{"output_tokens":42}}`, strings.TrimSuffix(strings.TrimPrefix(stop, "\nevent: message_stop\ndata: "), "\n\n")},
	}
	for name, r := range cases {
		evs, err := scanAll(t, r)
		if err != io.EOF {
			t.Fatalf("%s: error = %v", name, err)
		}
		if len(evs) != len(want[name]) {
			t.Fatalf("%s: %d events, want %d", name, len(evs), len(want[name]))
		}
		for i, w := range want[name] {
			if string(evs[i].data) != w {
				t.Errorf("%s: event %d data = %q, want %q", name, i, evs[i].data, w)
			}
		}
		var u usage
		for _, ev := range evs {
			u.fromEvent(ev)
		}
		if name == "blank line in the next read" && u.output != 42 {
			t.Errorf("%s: output tokens = %d, want 42", name, u.output)
		}
	}
}

// TestSSEScannerTrailingBlankLine: blank lines after the last event are not
// a cut-off event.
func TestSSEScannerTrailingBlankLine(t *testing.T) {
	t.Parallel()
	evs, err := scanAll(t, strings.NewReader("event: message_stop\ndata: {}\n\n\n"))
	if err != io.EOF || len(evs) != 1 {
		t.Fatalf("got %d events, error %v; want 1 event and io.EOF", len(evs), err)
	}
}

// FuzzSSEScanner: whatever the input, the scanner never panics, always
// makes progress, and the events' raw bytes, concatenated, are exactly the
// prefix of the input it consumed (at a clean io.EOF, all of it but
// trailing blank lines).
func FuzzSSEScanner(f *testing.F) {
	for _, s := range []string{
		"",
		"\n",
		"event: a\ndata: 1\n\n",
		"event: a\r\ndata: 1\r\n\r\n",
		"data: a\ndata: b\n\n\n\nevent: c\n\n",
		"event: a\ndata: 1\n\nevent: b\ndata: 2",
		": comment\n\n",
		"data\n\n",
		"event: message_start\ndata: {\"message\":{\"usage\":{\"input_tokens\":3}}}\n\nevent: message_delta\ndata: {\"usage\":{\"output_tokens\":9}}\n\n",
		"\r\n\r\n\r\n",
		"event: x\rdata: y\r\r",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		sc := newSSEScanner(bytes.NewReader(in))
		var consumed []byte
		for n := 0; ; n++ {
			if n > len(in)+1 {
				t.Fatalf("more events than input bytes: the scanner does not make progress")
			}
			ev, err := sc.next()
			if err != nil {
				if !bytes.HasPrefix(in, consumed) {
					t.Fatalf("raw bytes %q are not a prefix of the input %q", consumed, in)
				}
				switch {
				case err == io.EOF:
					// Whatever was not consumed can only be blank lines.
					if rest := in[len(consumed):]; len(bytes.Trim(rest, "\r\n")) != 0 {
						t.Fatalf("clean EOF but consumed %q of %q", consumed, in)
					}
				case errors.Is(err, io.ErrUnexpectedEOF):
					if len(consumed) == len(in) {
						t.Fatalf("ErrUnexpectedEOF with nothing left over")
					}
				case errors.Is(err, errSSETooLarge):
				default:
					t.Fatalf("unexpected error %v", err)
				}
				return
			}
			if len(ev.raw) == 0 {
				t.Fatal("an event with no raw bytes")
			}
			if !bytes.HasSuffix(ev.raw, []byte("\n")) {
				t.Fatalf("event raw %q does not end a line", ev.raw)
			}
			if ev.name == "" {
				t.Fatal("an event with an empty name")
			}
			consumed = append(consumed, ev.raw...)
		}
	})
}

// TestTrimEOL: as bytes.TrimRight with the cutset "\r\n".
func TestTrimEOL(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"", "\n", "\r\n", "\r", "\n\r\n\r", "data: x\r\n", "data: x\n", "a\rb\n", "x", " \n"} {
		if got, want := trimEOL([]byte(s)), bytes.TrimRight([]byte(s), "\r\n"); !bytes.Equal(got, want) {
			t.Errorf("trimEOL(%q) = %q, want %q", s, got, want)
		}
	}
}

// stallReader returns its bytes, then errStalled: the stream has nothing
// more yet. It counts the reads.
type stallReader struct {
	b     []byte
	reads int
}

var errStalled = errors.New("nothing more yet")

func (r *stallReader) Read(p []byte) (int, error) {
	r.reads++
	if len(r.b) == 0 {
		return 0, errStalled
	}
	n := copy(p, r.b)
	r.b = r.b[n:]
	return n, nil
}

// FuzzSSEEventBuffered: when eventBuffered says an event is buffered,
// next returns one without reading: the relay may leave what it wrote
// unflushed for it and no event waits on the stream's next bytes.
func FuzzSSEEventBuffered(f *testing.F) {
	for _, s := range []string{
		"event: a\ndata: 1\n\nevent: b\ndata: 2\n\n",
		"event: a\ndata: 1\n\nevent: b\ndata: 2",
		"event: a\r\ndata: 1\r\n\r\nevent: b\r\n\r\n",
		": ping\n\nevent: a\n\n",
		"\n\n\nevent: a\n\n\n",
		"data: x\n\ndata",
		"event: a\n" + strings.Repeat("x", 3000) + "\n\nevent: b\n\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		r := &stallReader{b: in}
		sc := newSSEScanner(r)
		for n := 0; n <= len(in)+1; n++ {
			buffered := sc.eventBuffered()
			before := r.reads
			_, err := sc.next()
			if buffered && (err != nil || r.reads != before) {
				t.Fatalf("after %d events: eventBuffered true, but next read %d more times and returned %v", n, r.reads-before, err)
			}
			if err != nil {
				return
			}
		}
		t.Fatal("the scanner does not make progress")
	})
}

// TestSSEEventBufferedBurst: of events that arrived in one read, each but
// the last finds the next one buffered; the last does not.
func TestSSEEventBufferedBurst(t *testing.T) {
	t.Parallel()
	for _, eol := range []string{"\n", "\r\n"} {
		burst := ""
		for i := range 4 {
			burst += fmt.Sprintf("event: content_block_delta%sdata: {\"i\":%d}%s%s", eol, i, eol, eol)
		}
		r := &stallReader{b: []byte(burst)}
		sc := newSSEScanner(r)
		for i := range 4 {
			if _, err := sc.next(); err != nil {
				t.Fatalf("event %d: %v", i, err)
			}
			if got, want := sc.eventBuffered(), i < 3; got != want {
				t.Errorf("%q: after event %d eventBuffered = %t, want %t", eol, i, got, want)
			}
		}
	}
}
