package dataplane

import (
	"bufio"
	"bytes"
	"errors"
	"io"
)

// sseEvent is one server-sent event as it came off the wire.
type sseEvent struct {
	// raw is the event's bytes including its terminating blank line,
	// relayed to the client unchanged.
	raw []byte
	// name is the event: field ("message" when absent).
	name string
	// data is the data: fields joined by newlines.
	data []byte
	// junk: a line that is no SSE field (event, data, id, retry or a
	// comment).
	junk bool
}

// maxSSEEvent bounds one event; a larger one is a broken upstream.
const maxSSEEvent = 16 << 20

var errSSETooLarge = errors.New("sse event exceeds 16 MiB")

// sseScanner splits an event stream into events without reinterpreting
// them: the bytes relayed are the bytes received.
type sseScanner struct {
	r *bufio.Reader
}

// sseBuffer is the scanner's read buffer. Events are small (a delta is a
// few hundred bytes) and a longer line is gathered past it, so a small
// buffer keeps thousands of open streams cheap: an idle stream holds it
// for as long as it stays open.
const sseBuffer = 1 << 10

func newSSEScanner(r io.Reader) *sseScanner {
	return &sseScanner{r: bufio.NewReaderSize(r, sseBuffer)}
}

// next returns the next event. At a clean end of stream it returns io.EOF;
// a stream cut inside an event returns io.ErrUnexpectedEOF.
func (s *sseScanner) next() (sseEvent, error) {
	var ev sseEvent
	var data [][]byte
	hasField := false // a non-blank line was read for this event
	for {
		line, err := s.r.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			// A long line: gather it whole.
			long := append([]byte(nil), line...)
			for errors.Is(err, bufio.ErrBufferFull) {
				line, err = s.r.ReadSlice('\n')
				long = append(long, line...)
				if len(long) > maxSSEEvent {
					return ev, errSSETooLarge
				}
			}
			line = long
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				if !hasField && len(trimEOL(line)) == 0 {
					// Only blank lines since the last event: a clean end.
					return ev, io.EOF
				}
				return ev, io.ErrUnexpectedEOF
			}
			return ev, err
		}
		ev.raw = append(ev.raw, line...)
		if len(ev.raw) > maxSSEEvent {
			return ev, errSSETooLarge
		}
		content := trimEOL(line)
		if len(content) == 0 {
			if len(ev.raw) == len(line) {
				// A stray blank line between events: keep it with the next.
				continue
			}
			break
		}
		hasField = true
		field, value, _ := bytes.Cut(content, []byte(":"))
		value = bytes.TrimPrefix(value, []byte(" "))
		switch string(field) {
		case "event":
			ev.name = string(value)
		case "data":
			// value points into the reader's buffer, which the next read
			// overwrites.
			data = append(data, bytes.Clone(value))
		case "", "id", "retry":
			// A comment (": keep-alive") or a field weir has no use for.
		default:
			ev.junk = true
		}
	}
	if ev.name == "" {
		ev.name = "message"
	}
	ev.data = bytes.Join(data, []byte("\n"))
	return ev, nil
}

// eventBuffered says whether next would return without reading: a whole
// event (a line that is not blank, then a blank one) is buffered already.
func (s *sseScanner) eventBuffered() bool {
	b, _ := s.r.Peek(s.r.Buffered())
	field := false
	for {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			return false
		}
		if len(trimEOL(b[:i])) > 0 {
			field = true
		} else if field {
			return true
		}
		b = b[i+1:]
	}
}

// trimEOL is line without the line endings at its end: bytes.TrimRight
// with a cutset, without building the cutset's set for every line.
func trimEOL(line []byte) []byte {
	for len(line) > 0 && (line[len(line)-1] == '\n' || line[len(line)-1] == '\r') {
		line = line[:len(line)-1]
	}
	return line
}
