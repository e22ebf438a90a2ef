// Command loadgen drives one target with chat completions requests and prints
// one JSON object with the latency distribution and the errors.
//
// Open loop (-rate R): request i is scheduled at start + i/R whatever the target
// does, and its latency runs from that scheduled time to the response's last
// byte, so a slow target cannot slow the generator down and hide its own queue
// (no coordinated omission).  Closed loop (-conns C, no -rate): C connections
// each send the next request as soon as the previous one has finished; that
// measures saturation throughput.
//
// Bodies come from a JSON Lines file, one template per line; "@@SEQ@@" becomes
// the request's sequence number and "@@MM@@" a two-digit minute, so no two
// bodies are byte-identical.  An error is a timeout, a connect or read failure,
// a status other than 200, or a stream without "data: [DONE]".
//
//	loadgen -url http://127.0.0.1:8787/v1/chat/completions -bodies b.jsonl -rate 200 -duration 10s
//	loadgen -url ... -bodies b.jsonl -conns 16 -duration 5s
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

type part struct {
	lit  []byte
	kind byte // 0: literal only, 's': sequence number, 'm': minute
}

type template []part

func parseTemplate(line []byte) template {
	var t template
	for len(line) > 0 {
		s := bytes.Index(line, []byte("@@SEQ@@"))
		m := bytes.Index(line, []byte("@@MM@@"))
		switch {
		case s < 0 && m < 0:
			t = append(t, part{lit: line})
			return t
		case m < 0 || (s >= 0 && s < m):
			t = append(t, part{lit: line[:s], kind: 's'})
			line = line[s+7:]
		default:
			t = append(t, part{lit: line[:m], kind: 'm'})
			line = line[m+6:]
		}
	}
	return t
}

func (t template) render(dst []byte, n uint64) []byte {
	for _, p := range t {
		dst = append(dst, p.lit...)
		switch p.kind {
		case 's':
			dst = strconv.AppendUint(dst, n, 10)
		case 'm':
			mm := (n / 7) % 60
			dst = append(dst, byte('0'+mm/10), byte('0'+mm%10))
		}
	}
	return dst
}

type result struct {
	latency time.Duration
	lag     time.Duration // actual send start minus scheduled time
	err     string
}

type summary struct {
	Mode        string             `json:"mode"`
	Stream      bool               `json:"stream"`
	Rate        float64            `json:"rate,omitempty"`
	Conns       int                `json:"conns,omitempty"`
	DurationS   float64            `json:"duration_s"`
	Sent        int                `json:"sent"`
	OK          int                `json:"ok"`
	Errors      int                `json:"errors"`
	ErrorKinds  map[string]int     `json:"error_kinds"`
	AchievedRPS float64            `json:"achieved_rps"`
	LatencyMS   map[string]float64 `json:"latency_ms"`
	MaxLagMS    float64            `json:"max_send_lag_ms"`
	BodyBytes   [2]int             `json:"body_bytes"`
}

type runner struct {
	url       string
	headers   http.Header
	templates []template
	stream    bool
	timeout   time.Duration
	client    *http.Client
	seq       atomic.Uint64
	bufs      sync.Pool
}

func (r *runner) one(ctx context.Context) string {
	n := r.seq.Add(1)
	t := r.templates[int(n)%len(r.templates)]
	bp := r.bufs.Get().(*[]byte)
	body := t.render((*bp)[:0], n)
	defer func() { *bp = body; r.bufs.Put(bp) }()
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.url, bytes.NewReader(body))
	if err != nil {
		return "request"
	}
	req.Header = r.headers.Clone()
	req.ContentLength = int64(len(body))
	resp, err := r.client.Do(req)
	if err != nil {
		return classify(err)
	}
	defer resp.Body.Close()
	rb := r.bufs.Get().(*[]byte)
	data, err := readAll(resp.Body, (*rb)[:0])
	defer func() { *rb = data; r.bufs.Put(rb) }()
	if err != nil {
		return classify(err)
	}
	if resp.StatusCode != http.StatusOK {
		return "status_" + strconv.Itoa(resp.StatusCode)
	}
	if r.stream && !bytes.Contains(data, []byte("data: [DONE]")) {
		return "no_done"
	}
	if !r.stream && (len(data) == 0 || data[0] != '{') {
		return "bad_body"
	}
	return ""
}

func readAll(rd io.Reader, b []byte) ([]byte, error) {
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := rd.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return b, err
		}
	}
}

func classify(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()):
		return "timeout"
	case strings.Contains(err.Error(), "connection refused") || strings.Contains(err.Error(), "dial"):
		return "connect"
	default:
		return "io"
	}
}

// open runs the fixed-rate schedule; latency counts from each scheduled time.
func (r *runner) open(rate float64, d time.Duration) ([]result, time.Duration) {
	n := int(rate * d.Seconds())
	interval := time.Duration(float64(time.Second) / rate)
	results := make([]result, n)
	var wg sync.WaitGroup
	start := time.Now().Add(5 * time.Millisecond)
	for i := 0; i < n; i++ {
		at := start.Add(time.Duration(i) * interval)
		if wait := time.Until(at); wait > 0 {
			time.Sleep(wait)
		}
		wg.Add(1)
		go func(i int, at time.Time) {
			defer wg.Done()
			lag := time.Since(at)
			kind := r.one(context.Background())
			results[i] = result{latency: time.Since(at), lag: lag, err: kind}
		}(i, at)
	}
	wg.Wait()
	return results, time.Since(start)
}

// closed keeps conns requests in flight until d has passed.
func (r *runner) closed(conns int, d time.Duration) ([]result, time.Duration) {
	var mu sync.Mutex
	var results []result
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(d)
	for c := 0; c < conns; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			local := make([]result, 0, 4096)
			for time.Now().Before(deadline) {
				t0 := time.Now()
				kind := r.one(context.Background())
				local = append(local, result{latency: time.Since(t0), err: kind})
			}
			mu.Lock()
			results = append(results, local...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return results, time.Since(start)
}

func summarize(results []result, wall time.Duration) summary {
	s := summary{Sent: len(results), ErrorKinds: map[string]int{}, LatencyMS: map[string]float64{}}
	lat := make([]float64, 0, len(results))
	for _, res := range results {
		if lag := float64(res.lag) / 1e6; lag > s.MaxLagMS {
			s.MaxLagMS = lag
		}
		if res.err != "" {
			s.Errors++
			s.ErrorKinds[res.err]++
			continue
		}
		s.OK++
		lat = append(lat, float64(res.latency)/1e6)
	}
	sort.Float64s(lat)
	pct := func(p float64) float64 {
		if len(lat) == 0 {
			return 0
		}
		i := int(p*float64(len(lat))+0.5) - 1
		if i < 0 {
			i = 0
		}
		if i >= len(lat) {
			i = len(lat) - 1
		}
		return round3(lat[i])
	}
	for name, p := range map[string]float64{"p50": 0.50, "p90": 0.90, "p99": 0.99, "max": 1.0} {
		s.LatencyMS[name] = pct(p)
	}
	if len(lat) > 0 {
		var sum float64
		for _, v := range lat {
			sum += v
		}
		s.LatencyMS["mean"] = round3(sum / float64(len(lat)))
	}
	s.DurationS = round3(wall.Seconds())
	if wall > 0 {
		s.AchievedRPS = round3(float64(s.OK) / wall.Seconds())
	}
	s.MaxLagMS = round3(s.MaxLagMS)
	return s
}

func round3(v float64) float64 { return float64(int64(v*1000+0.5)) / 1000 }

type headerFlags []string

func (h *headerFlags) String() string     { return strings.Join(*h, ", ") }
func (h *headerFlags) Set(v string) error { *h = append(*h, v); return nil }

func main() {
	url := flag.String("url", "", "chat completions URL")
	bodies := flag.String("bodies", "", "JSON Lines file of body templates")
	rate := flag.Float64("rate", 0, "open loop: requests per second (0: closed loop)")
	conns := flag.Int("conns", 16, "closed loop: connections; open loop: connection cap is -max-conns")
	maxConns := flag.Int("max-conns", 1024, "open loop: most connections to the target at once")
	duration := flag.Duration("duration", 10*time.Second, "how long to send")
	warmup := flag.Duration("warmup", 0, "send at the same rate / connections for this long first, not measured")
	timeout := flag.Duration("timeout", 5*time.Second, "per-request timeout (an error past it)")
	stream := flag.Bool("stream", false, "the bodies ask for a stream: require data: [DONE]")
	var hdrs headerFlags
	flag.Var(&hdrs, "H", "extra request header 'Name: value' (repeatable)")
	flag.Parse()
	if *url == "" || *bodies == "" {
		fmt.Fprintln(os.Stderr, "usage: loadgen -url URL -bodies FILE [-rate R | -conns C] [-duration D]")
		os.Exit(2)
	}
	templates, sizes, err := loadTemplates(*bodies)
	if err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(2)
	}
	limit := *maxConns
	if *rate == 0 {
		limit = *conns
	}
	transport := &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 2 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        limit,
		MaxIdleConnsPerHost: limit,
		MaxConnsPerHost:     limit,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
		ForceAttemptHTTP2:   false,
	}
	r := &runner{
		url: *url, templates: templates, stream: *stream, timeout: *timeout,
		client:  &http.Client{Transport: transport},
		headers: http.Header{"Content-Type": {"application/json"}, "Accept": {"application/json"}},
	}
	r.bufs.New = func() any { b := make([]byte, 0, 96<<10); return &b }
	for _, h := range hdrs {
		k, v, ok := strings.Cut(h, ":")
		if !ok {
			fmt.Fprintln(os.Stderr, "loadgen: bad header", h)
			os.Exit(2)
		}
		r.headers.Set(strings.TrimSpace(k), strings.TrimSpace(v))
	}
	var s summary
	if *rate > 0 {
		if *warmup > 0 {
			r.open(*rate, *warmup)
		}
		res, wall := r.open(*rate, *duration)
		s = summarize(res, wall)
		s.Mode, s.Rate = "open", *rate
		// Achieved rate of an open loop: completions over the schedule's length, so a
		// target that keeps up shows the requested rate even if the last reply is late.
		if sched := duration.Seconds(); sched > 0 && wall.Seconds() > sched {
			s.AchievedRPS = round3(float64(s.OK) / wall.Seconds())
		} else if sched > 0 {
			s.AchievedRPS = round3(float64(s.OK) / sched)
		}
	} else {
		if *warmup > 0 {
			r.closed(*conns, *warmup)
		}
		res, wall := r.closed(*conns, *duration)
		s = summarize(res, wall)
		s.Mode, s.Conns = "closed", *conns
	}
	s.Stream = *stream
	s.BodyBytes = sizes
	out, _ := json.Marshal(s)
	fmt.Println(string(out))
}

func loadTemplates(path string) ([]template, [2]int, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, [2]int{}, err
	}
	defer f.Close()
	var out []template
	sizes := [2]int{1 << 30, 0}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		cp := append([]byte(nil), line...)
		out = append(out, parseTemplate(cp))
		if len(cp) < sizes[0] {
			sizes[0] = len(cp)
		}
		if len(cp) > sizes[1] {
			sizes[1] = len(cp)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, sizes, err
	}
	if len(out) == 0 {
		return nil, sizes, fmt.Errorf("%s: no body templates", path)
	}
	return out, sizes, nil
}
