package io.rmqha.interop.admin;

import com.alibaba.fastjson2.JSON;
import java.io.BufferedReader;
import java.io.ByteArrayOutputStream;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.apache.rocketmq.tools.command.MQAdminStartup;

/**
 * mqadmin, many commands in one JVM: each line of stdin is a JSON array of mqadmin's
 * arguments ({@code ["clusterList", "-n", "127.0.0.1:9876"]}); each is run through
 * {@link MQAdminStartup#main0} exactly as the {@code mqadmin} script runs it (credentials from
 * {@code $ROCKETMQ_HOME/conf/tools.yml}, TLS from the system properties), and answered by one
 * JSON line on stdout: {@code {"argv": [...], "out": "...", "err": "...", "ms": n}}, where
 * out and err are what the command printed.
 *
 * <p>Why one JVM: a JVM loading mqadmin's classes takes 1.5 s of CPU, 15-20 s of wall time on
 * two busy cores; a session pays that once for all the commands of a test module.
 */
public final class AdminSession {
    private AdminSession() {
    }

    public static void main(String[] args) throws Exception {
        PrintStream realOut = System.out;
        PrintStream realErr = System.err;
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            if (line.isBlank()) {
                continue;
            }
            List<String> argv = JSON.parseArray(line, String.class);
            ByteArrayOutputStream out = new ByteArrayOutputStream();
            ByteArrayOutputStream err = new ByteArrayOutputStream();
            long start = System.nanoTime();
            try (PrintStream o = new PrintStream(out, true, StandardCharsets.UTF_8);
                 PrintStream e = new PrintStream(err, true, StandardCharsets.UTF_8)) {
                System.setOut(o);
                System.setErr(e);
                try {
                    MQAdminStartup.main0(argv.toArray(new String[0]), null);
                } catch (RuntimeException | LinkageError t) {
                    t.printStackTrace(e);  // main0 catches Exception itself; this is what escapes it
                }
            } finally {
                System.setOut(realOut);
                System.setErr(realErr);
            }
            Map<String, Object> answer = new LinkedHashMap<>();
            answer.put("argv", argv);
            answer.put("out", out.toString(StandardCharsets.UTF_8));
            answer.put("err", err.toString(StandardCharsets.UTF_8));
            answer.put("ms", (System.nanoTime() - start) / 1_000_000);
            realOut.println(JSON.toJSONString(answer));
            realOut.flush();
        }
    }
}
