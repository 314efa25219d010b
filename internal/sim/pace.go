package sim

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// StreamHeader, on a streamed /v1/messages request, sets that reply's
// shape, so a load generator can vary it per request through a proxy that
// forwards headers: "32x15ms" sends 32 deltas 15 ms apart; "hold" sends
// the first delta and then stays open and silent until the client goes
// away (an idle stream). Absent or malformed: the Config's shape.
const StreamHeader = "Sim-Stream"

// StreamPace is a parsed StreamHeader.
type StreamPace struct {
	Deltas int
	Delay  time.Duration
	Hold   bool
}

// String is the header value that parses back to p.
func (p StreamPace) String() string {
	if p.Hold {
		return "hold"
	}
	return fmt.Sprintf("%dx%s", p.Deltas, p.Delay)
}

// maxPaceDeltas bounds a header's delta count: the reply is built per
// request.
const maxPaceDeltas = 4096

func parseStreamHeader(v string) (StreamPace, bool) {
	if v == "" {
		return StreamPace{}, false
	}
	if v == "hold" {
		return StreamPace{Deltas: 1, Hold: true}, true
	}
	n, d, ok := strings.Cut(v, "x")
	if !ok {
		return StreamPace{}, false
	}
	deltas, err := strconv.Atoi(n)
	if err != nil || deltas < 1 || deltas > maxPaceDeltas {
		return StreamPace{}, false
	}
	delay, err := time.ParseDuration(d)
	if err != nil || delay < 0 {
		return StreamPace{}, false
	}
	return StreamPace{Deltas: deltas, Delay: delay}, true
}
