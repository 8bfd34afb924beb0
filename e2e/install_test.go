package e2e

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/gpu-dra/gpu-dra/e2e/framework"
)

// installForTest installs the chart with the given helm arguments for the test and uninstalls it
// when the test ends, showing the plugin's and the webhook's recent logs first if it failed. The
// seed's template for version is the probe that waits for the webhook.
func installForTest(t *testing.T, c *framework.Cluster, version string, helmArgs ...string) {
	t.Helper()
	t.Cleanup(func() {
		if t.Failed() {
			for _, sel := range []string{pluginSelector, webhookSelector} {
				logs, _ := c.KubectlErr("-n", releaseNS, "logs", "-l", sel, "--tail=60", "--all-containers")
				t.Logf("logs of %s:\n%s", sel, logs)
			}
		}
		c.Helm(t, "uninstall", release, "-n", releaseNS, "--wait", "--timeout", "3m")
	})
	start := time.Now()
	c.InstallChart(t, filepath.Join("..", "charts", "gpu-dra"), filepath.Join("testdata", "seed", seedTemplate(version)), helmArgs...)
	t.Logf("installed in %s", time.Since(start).Round(time.Second))
}
