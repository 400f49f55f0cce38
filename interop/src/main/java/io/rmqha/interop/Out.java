package io.rmqha.interop;

import com.alibaba.fastjson2.JSON;
import java.util.LinkedHashMap;
import java.util.Map;

/** One JSON object a line on stdout: what a driver did and saw, for the Python test to judge. */
public final class Out {
    /** Added to every line as {@code "cmd"} while set: which step of a driver printed it. */
    private static volatile String step;

    private Out() {
    }

    public static void step(String name) {
        step = name;
    }

    /** Print {@code key, value, key, value, ...} as one JSON object (keys in order). */
    public static synchronized void emit(Object... keysAndValues) {
        if (keysAndValues.length % 2 != 0) {
            throw new IllegalArgumentException("emit takes key, value pairs");
        }
        Map<String, Object> map = new LinkedHashMap<>();
        String current = step;
        if (current != null) {
            map.put("cmd", current);
        }
        for (int i = 0; i < keysAndValues.length; i += 2) {
            map.put(String.valueOf(keysAndValues[i]), keysAndValues[i + 1]);
        }
        System.out.println(JSON.toJSONString(map));
        System.out.flush();
    }
}
