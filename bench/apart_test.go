package bench

import (
	"slices"
	"strings"
	"testing"
)

func TestParsePeer(t *testing.T) {
	t.Parallel()
	p, err := ParsePeer("name=cliproxy,cmd=/opt/peer/bin --config /tmp/a,b.yaml,url=http://127.0.0.1:8317,header=Authorization: Bearer sk-x,header=X-Extra: 1")
	if err != nil {
		t.Fatal(err)
	}
	if p.Name != "cliproxy" || p.URL != "http://127.0.0.1:8317" ||
		!slices.Equal(p.Cmd, []string{"/opt/peer/bin", "--config", "/tmp/a,b.yaml"}) {
		t.Errorf("parsed %+v; a comma not before a key belongs to the value", p)
	}
	if p.Header.Get("Authorization") != "Bearer sk-x" || p.Header.Get("X-Extra") != "1" {
		t.Errorf("headers %v", p.Header)
	}
	for spec, want := range map[string]string{
		"cmd=/bin/x,url=http://h":                 "required",
		"name=bare,cmd=/bin/x,url=http://h":       "built-in",
		"name=p,cmd=/bin/x,url=h:1":               "not http",
		"name=p,cmd=/bin/x,url=http://h,header=x": "Name: value",
		"/bin/x": "want name=",
	} {
		if _, err := ParsePeer(spec); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParsePeer(%q) = %v, want an error saying %q", spec, err, want)
		}
	}
}
