package serve

import (
	"crypto/subtle"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Metrics serves reg's metrics in Prometheus' text format. With a token,
// only to a scrape that sends it as a bearer (Prometheus'
// authorization.credentials); without one, to anyone.
func Metrics(reg *prometheus.Registry, token string) http.Handler {
	h := promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	if token == "" {
		return h
	}
	want := []byte("Bearer " + token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="weir metrics"`)
			http.Error(w, "metrics need the metrics token (WEIR_METRICS_TOKEN) as a bearer", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
}
