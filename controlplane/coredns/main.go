// CoreDNS 1.14.2 (the version kubeadm installs with Kubernetes 1.36) with the plugins a
// cluster's DNS uses, built in this module so that it compiles against the Kubernetes
// libraries the control plane already compiled. CoreDNS's own way to choose plugins at build
// time is a main package that imports coremain and them
// (https://coredns.io/2017/07/25/compile-time-enabling-or-disabling-plugins/); its default
// main imports all of plugin.cfg, whose cloud back ends (Route 53, Azure, Cloud DNS) and
// tracers took most of its build. The order in which plugins run stays coremain's
// (core/dnsserver/zdirectives.go). The plugins: those of kubeadm's Corefile (errors, health,
// ready, kubernetes, prometheus, forward, cache, loop, reload, loadbalance) and bind and log.
package main

import (
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
)

func main() { coremain.Run() }
