// The Go floor for tests/benchmarks/webhook.py: Go's standard library parsing an AdmissionReview
// and allowing it, the least any webhook does per review. Built and run by the benchmark only
// (`go build`, no module, no dependency), pinned beside the Python servers with GOMAXPROCS=1.
package main

import (
	"encoding/json"
	"net/http"
	"os"
)

type review struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Request    struct {
		UID    string          `json:"uid"`
		Object json.RawMessage `json:"object"`
	} `json:"request"`
}

type response struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Response   struct {
		UID     string `json:"uid"`
		Allowed bool   `json:"allowed"`
	} `json:"response"`
}

func mutate(w http.ResponseWriter, r *http.Request) {
	var in review
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var pod map[string]any // the Pod decoded, as a webhook that looks at it must
	if err := json.Unmarshal(in.Request.Object, &pod); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var out response
	out.APIVersion, out.Kind = in.APIVersion, in.Kind
	out.Response.UID, out.Response.Allowed = in.Request.UID, true
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(&out)
}

func main() {
	http.HandleFunc("/mutate", mutate)
	http.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	if err := http.ListenAndServe("127.0.0.1:"+os.Getenv("PORT"), nil); err != nil {
		panic(err)
	}
}
