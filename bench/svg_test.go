package bench

import (
	"encoding/xml"
	"errors"
	"io"
	"strings"
	"testing"
	"time"
)

func TestSVGIsXMLWithEverySeries(t *testing.T) {
	t.Parallel()
	r := &Results{}
	r.Config.SimLatencies = []time.Duration{0, 50 * time.Millisecond}
	r.Config.Rates = []int{100, 1000}
	for _, lat := range r.Config.SimLatencies {
		for _, rate := range r.Config.Rates {
			for i, name := range targetNames {
				r.Steps = append(r.Steps, Step{SimLatency: lat, Target: name, Rate: rate, stepLoad: stepLoad{Measured: 10,
					Latency: Summary{N: 10, P50: time.Duration(i+1) * time.Millisecond, P99: time.Duration(i+2) * time.Millisecond}}})
			}
		}
	}
	svg := NewReport(r).SVG()
	dec := xml.NewDecoder(strings.NewReader(svg))
	panels := 0
	series := map[string]int{}
	root := ""
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("not XML: %v\n%s", err, svg)
		}
		se, ok := tok.(xml.StartElement)
		if !ok {
			continue
		}
		if root == "" {
			root = se.Name.Local
		}
		attr := func(name string) string {
			for _, a := range se.Attr {
				if a.Name.Local == name {
					return a.Value
				}
			}
			return ""
		}
		switch {
		case se.Name.Local == "g" && attr("class") == "panel":
			panels++
		case se.Name.Local == "polyline" && attr("class") == "series":
			series[attr("data-series")]++
			if n := len(strings.Fields(attr("points"))); n != 2 {
				t.Errorf("series %s has %d points, want 2", attr("data-series"), n)
			}
		}
	}
	if root != "svg" || panels != 2 {
		t.Errorf("root %q, %d panels; want svg and 2", root, panels)
	}
	for _, s := range plotSeries {
		if series[s.id] != 2 {
			t.Errorf("series %s drawn %d times, want once per panel", s.id, series[s.id])
		}
	}
}
